/*
 * uop.c -- hash-consed UOp nodes and the symbolic simplifier for index arithmetic.
 *
 * In: op, dtype, sources, arguments. Out: a unique node per structure (intern table), reference
 * counted. Invariants: a live node is in the intern table exactly once; a node's sources outlive it
 * (it holds a reference to each); identity = (op, dtype, src pointers, iarg, arg bits).
 *
 * The simplifier keeps int64 index expressions as canonical affine sums (terms sorted by creation id)
 * and folds floor-division / modulo by constants using value bounds (vmin/vmax), which every index
 * node carries from creation.
 */
#include "uop.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptrmap.h"

const char *const op_names[OP_COUNT] = {
#define X(name, flags) #name,
    TG_OPS(X)
#undef X
};
const int op_flags[OP_COUNT] = {
#define X(name, flags) flags,
    TG_OPS(X)
#undef X
};

/* ---- intern table ---- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static UOp **g_buckets;
static size_t g_nbuckets, g_count;
static uint64_t g_next_id = 1;

size_t uop_live_count(void) { return g_count; }

bool uop_any_grad_leaf;

void uop_clear_kmarks(void) {
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_nbuckets; i++)
    for (UOp *u = g_buckets[i]; u; u = u->next) u->kmark = 0;
  pthread_mutex_unlock(&g_lock);
}

static uint64_t uop_hash(int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg, int niarg,
                         UArg arg) {
  uint64_t h = hash_mix((uint64_t)op * 131 + (uint64_t)dt, (uint64_t)arg.i);
  for (int i = 0; i < nsrc; i++) h = hash_mix(h, src[i]->hash ^ (uint64_t)(uintptr_t)src[i]);
  for (int i = 0; i < niarg; i++) h = hash_mix(h, (uint64_t)iarg[i]);
  return hash_mix(h, (uint64_t)(nsrc * 7 + niarg));
}

static bool uop_eq(const UOp *u, int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg,
                   int niarg, UArg arg) {
  if (u->op != op || u->dtype != dt || (int)u->nsrc != nsrc || (int)u->niarg != niarg || u->arg.i != arg.i)
    return false;
  for (int i = 0; i < nsrc; i++)
    if (u->src[i] != src[i]) return false;
  for (int i = 0; i < niarg; i++)
    if (u->iarg[i] != iarg[i]) return false;
  return true;
}

static void table_grow(void) {
  size_t nb = g_nbuckets ? g_nbuckets * 2 : 4096;
  UOp **nbk = tg_xcalloc(nb, sizeof(UOp *));
  for (size_t i = 0; i < g_nbuckets; i++) {
    UOp *u = g_buckets[i];
    while (u) {
      UOp *nx = u->next;
      size_t b = u->hash & (nb - 1);
      u->next = nbk[b];
      nbk[b] = u;
      u = nx;
    }
  }
  free(g_buckets);
  g_buckets = nbk;
  g_nbuckets = nb;
}

static int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return (a > 0) ? INT64_MAX : INT64_MIN;
  return r;
}
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return ((a > 0) == (b > 0)) ? INT64_MAX : INT64_MIN;
  return r;
}

static void compute_bounds(UOp *u) {
  u->vmin = INT64_MIN, u->vmax = INT64_MAX;
  if (u->dtype == TG_BOOL) u->vmin = 0, u->vmax = 1;
  if (u->dtype != DT_INDEX && u->dtype != TG_BOOL) return;
  UOp *a = u->nsrc > 0 ? u->src[0] : NULL, *b = u->nsrc > 1 ? u->src[1] : NULL;
  switch (u->op) {
  case OP_CONST:
    u->vmin = u->vmax = u->arg.i;
    break;
  case OP_RANGE:
    u->vmin = 0, u->vmax = u->iarg[0] - 1;
    break;
  case OP_DEFINE_VAR:
    u->vmin = u->iarg[0], u->vmax = u->iarg[1];
    break;
  case OP_ADD:
    u->vmin = sat_add(a->vmin, b->vmin), u->vmax = sat_add(a->vmax, b->vmax);
    break;
  case OP_MUL: {
    int64_t c[4] = {sat_mul(a->vmin, b->vmin), sat_mul(a->vmin, b->vmax), sat_mul(a->vmax, b->vmin),
                    sat_mul(a->vmax, b->vmax)};
    u->vmin = u->vmax = c[0];
    for (int i = 1; i < 4; i++) {
      if (c[i] < u->vmin) u->vmin = c[i];
      if (c[i] > u->vmax) u->vmax = c[i];
    }
    break;
  }
  case OP_IDIV:
    if (b->op == OP_CONST && b->arg.i > 0 && a->vmin >= 0) u->vmin = a->vmin / b->arg.i, u->vmax = a->vmax / b->arg.i;
    break;
  case OP_WHERE: /* an index chosen between two: s_minc's clamp */
    if (u->nsrc == 3) {
      UOp *c = u->src[2];
      u->vmin = b->vmin < c->vmin ? b->vmin : c->vmin;
      u->vmax = b->vmax > c->vmax ? b->vmax : c->vmax;
      /* where(x < y, x, y) is min(x, y) and where(x < y, y, x) is max(x, y): the bound on the
       * side the comparison cuts is the tighter of the two */
      if (a->op == OP_CMPLT && a->nsrc == 2) {
        UOp *x = a->src[0], *y = a->src[1];
        if (b == x && c == y) u->vmax = x->vmax < y->vmax ? x->vmax : y->vmax;
        if (b == y && c == x) u->vmin = x->vmin > y->vmin ? x->vmin : y->vmin;
      }
    }
    break;
  case OP_MAX:
    u->vmin = a->vmin > b->vmin ? a->vmin : b->vmin, u->vmax = a->vmax > b->vmax ? a->vmax : b->vmax;
    break;
  case OP_MOD:
    if (b->op == OP_CONST && b->arg.i > 0) {
      if (a->vmin >= 0) u->vmin = 0, u->vmax = a->vmax < b->arg.i - 1 ? a->vmax : b->arg.i - 1;
      else u->vmin = -(b->arg.i - 1), u->vmax = b->arg.i - 1;
    }
    break;
  default:
    break;
  }
}

/* Fills a tensor-graph node's shape and device. Caller holds g_lock, and the node is either not yet
 * in the table or found there without them: either way no thread can have read them yet through a
 * builder, so the fields are complete before any reader sees UOPF_META. */
static void fill_meta(UOp *u, const int64_t *shape, int ndim, int device, int64_t *inl) {
  u->ndim = ndim;
  u->device = device;
  if (ndim) {
    u->shape = inl ? inl : tg_xmalloc(sizeof(int64_t) * (size_t)ndim);
    u->shape_inline = inl != NULL;
    memcpy(u->shape, shape, sizeof(int64_t) * (size_t)ndim);
  } else {
    /* a 0-d node's shape is an empty array, never NULL: copying its ndim entries (none) with memcpy
     * is then defined (a NULL source is undefined even for 0 bytes) */
    static int64_t no_dims[1];
    u->shape = no_dims;
    u->shape_inline = true;
  }
  bool lost = false, baked = false;
  u->sym = ndim ? sym_infer(u, &lost, &baked) : NULL;
  if (lost) __atomic_fetch_or(&u->flags, (uint8_t)UOPF_SYM_LOST, __ATOMIC_RELEASE);
  if (baked) __atomic_fetch_or(&u->flags, (uint8_t)UOPF_SYM_BAKED, __ATOMIC_RELEASE);
  __atomic_fetch_or(&u->flags, (uint8_t)UOPF_META, __ATOMIC_RELEASE);
}

UOp *uop_new_meta(int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg, int niarg, UArg arg,
                  const int64_t *shape, int ndim, int device) {
  uint64_t h = uop_hash(op, dt, src, nsrc, iarg, niarg, arg);
  pthread_mutex_lock(&g_lock);
  if (g_count + 1 > g_nbuckets) table_grow();
  size_t b = h & (g_nbuckets - 1);
  for (UOp *u = g_buckets[b]; u; u = u->next) {
    if (u->hash == h && uop_eq(u, op, dt, src, nsrc, iarg, niarg, arg)) {
      __atomic_fetch_add(&u->rc, 1, __ATOMIC_RELAXED);
      if (ndim >= 0 && !(__atomic_load_n(&u->flags, __ATOMIC_RELAXED) & UOPF_META)) fill_meta(u, shape, ndim, device, NULL);
      pthread_mutex_unlock(&g_lock);
      return u;
    }
  }
  /* one allocation: the node, then its sources, its iarg and (a tensor-graph node) its shape */
  size_t extra = sizeof(UOp *) * (size_t)nsrc + sizeof(int64_t) * (size_t)niarg + sizeof(int64_t) * (size_t)(ndim > 0 ? ndim : 0);
  UOp *u = tg_xmalloc(sizeof(UOp) + extra);
  memset(u, 0, sizeof(UOp));
  char *tail = (char *)(u + 1);
  u->op = (uint16_t)op;
  u->dtype = (uint8_t)dt;
  u->nsrc = (uint32_t)nsrc;
  u->niarg = (uint32_t)niarg;
  u->hash = h;
  u->arg = arg;
  u->rc = 1;
  u->id = g_next_id++;
  u->device = -1;
  if (nsrc) {
    u->src = (UOp **)tail;
    tail += sizeof(UOp *) * (size_t)nsrc;
    for (int i = 0; i < nsrc; i++) {
      u->src[i] = src[i];
      __atomic_fetch_add(&src[i]->rc, 1, __ATOMIC_RELAXED);
    }
  }
  if (niarg) {
    u->iarg = (int64_t *)tail;
    tail += sizeof(int64_t) * (size_t)niarg;
    memcpy(u->iarg, iarg, sizeof(int64_t) * (size_t)niarg);
  }
  compute_bounds(u);
  if (ndim >= 0) fill_meta(u, shape, ndim, device, ndim > 0 ? (int64_t *)tail : NULL);
  /* published only now, complete: another thread finding it in the table sees every field */
  u->next = g_buckets[b];
  g_buckets[b] = u;
  g_count++;
  pthread_mutex_unlock(&g_lock);
  return u;
}

UOp *uop_new(int op, tg_dtype dt, UOp *const *src, int nsrc, const int64_t *iarg, int niarg, UArg arg) {
  return uop_new_meta(op, dt, src, nsrc, iarg, niarg, arg, NULL, -1, -1);
}

/* Reference counts are atomic. A count reaches zero only under g_lock, in the same critical section
 * that unlinks the node, and the table hands out a node only under g_lock: so a caller that already
 * holds a reference may add one, or drop one that is not the last, without the lock. */
UOp *uop_ref(UOp *u) {
  if (!u) return NULL;
  __atomic_fetch_add(&u->rc, 1, __ATOMIC_RELAXED);
  return u;
}

/* BUFFER nodes own a Buffer reference; the tensor layer registers how to drop it so this file stays
 * independent of the runtime. Both hooks are written and read atomically: any thread may create the
 * first buffer node (or custom-gradient node) while another frees one. */
void (*uop_buffer_release_hook)(void *buf);
void (*uop_free_hook)(UOp *u);

/* A stack of nodes that lives on the C stack until it outgrows it (most releases free a few nodes). */
typedef struct {
  UOp **p;
  size_t n, cap;
  UOp *inl[32];
} RelStack;

static void rs_push(RelStack *s, UOp *u) {
  if (s->n == s->cap) {
    size_t nc = s->cap * 2;
    UOp **np = tg_xmalloc(sizeof(UOp *) * nc);
    memcpy(np, s->p, sizeof(UOp *) * s->n);
    if (s->p != s->inl) free(s->p);
    s->p = np, s->cap = nc;
  }
  s->p[s->n++] = u;
}

static void rs_init(RelStack *s) { s->p = s->inl, s->n = 0, s->cap = sizeof s->inl / sizeof *s->inl; }
static void rs_free(RelStack *s) {
  if (s->p != s->inl) free(s->p);
  rs_init(s);
}

/* The release under way on this thread: a free hook that drops references of its own (a realized
 * node's autograd history) hands them to it instead of starting a nested release, so a chain of
 * histories a million long is freed in one loop rather than a million nested calls. */
static _Thread_local RelStack *tl_releasing;

void uop_unref(UOp *u) {
  if (!u) return;
  /* not the last reference: drop it without the lock (see uop_ref) */
  uint32_t rc = __atomic_load_n(&u->rc, __ATOMIC_RELAXED);
  while (rc > 1)
    if (__atomic_compare_exchange_n(&u->rc, &rc, rc - 1, true, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) return;
  if (tl_releasing) {
    rs_push(tl_releasing, u);
    return;
  }
  /* iterative release: a long chain must not overflow the C stack */
  bool oom_mark = tg_oom_mark(); /* the scratch below may run short; the release still completes */
  RelStack stack, dead;
  rs_init(&stack), rs_init(&dead);
  rs_push(&stack, u);
  tl_releasing = &stack;
  while (stack.n) {
    pthread_mutex_lock(&g_lock);
    while (stack.n) {
      UOp *x = stack.p[--stack.n];
      if (__atomic_sub_fetch(&x->rc, 1, __ATOMIC_ACQ_REL)) continue;
      /* unlink from the intern table */
      size_t b = x->hash & (g_nbuckets - 1);
      UOp **pp = &g_buckets[b];
      while (*pp != x) pp = &(*pp)->next;
      *pp = x->next;
      g_count--;
      for (uint32_t i = 0; i < x->nsrc; i++) rs_push(&stack, x->src[i]);
      if (uop_realized(x) && !(uop_flags(x) & UOPF_WEAK_REALIZED)) rs_push(&stack, uop_realized(x));
      rs_push(&dead, x);
    }
    pthread_mutex_unlock(&g_lock);
    for (size_t i = 0; i < dead.n; i++) {
      UOp *x = dead.p[i];
      void (*release)(void *) = __atomic_load_n(&uop_buffer_release_hook, __ATOMIC_ACQUIRE);
      if (x->op == OP_BUFFER && release) release(x->arg.p);
      void (*on_free)(UOp *) = __atomic_load_n(&uop_free_hook, __ATOMIC_ACQUIRE);
      if ((uop_flags(x) & UOPF_HOOKED) && on_free) on_free(x); /* may push onto stack */
      if (!x->shape_inline) free(x->shape);
      free(x->sym);
      free(x);
    }
    dead.n = 0;
  }
  tl_releasing = NULL;
  rs_free(&stack);
  rs_free(&dead);
  tg_oom_forget(oom_mark);
}

UOp *uop_const_i(tg_dtype dt, int64_t v) {
  UArg a;
  a.i = v;
  return uop_new(OP_CONST, dt, NULL, 0, NULL, 0, a);
}
UOp *uop_const_f(tg_dtype dt, double v) {
  UArg a;
  a.f = v;
  return uop_new(OP_CONST, dt, NULL, 0, NULL, 0, a);
}
double uop_const_as_f(const UOp *u) { return tg_dtype_is_float((tg_dtype)u->dtype) ? u->arg.f : (double)u->arg.i; }
int64_t uop_const_as_i(const UOp *u) {
  return tg_dtype_is_float((tg_dtype)u->dtype) ? (int64_t)u->arg.f : u->arg.i;
}

UOp *uop_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c) {
  UOp *s[3] = {a, b, c};
  int n = c ? 3 : (b ? 2 : 1);
  UArg z = {0};
  return uop_new(op, dt, s, n, NULL, 0, z);
}

/* ---------------------------------------------------------------------------------------------- */
/* symbolic index arithmetic                                                                       */

UOp *s_const(int64_t v) { return uop_const_i(DT_INDEX, v); }

UOp *s_range(int axis, int64_t size) {
  UArg a;
  a.i = axis;
  return uop_new(OP_RANGE, DT_INDEX, NULL, 0, &size, 1, a);
}

UOp *s_range_sym(int axis, int64_t max, UOp *end) {
  if (end->op == OP_CONST) return s_range(axis, end->arg.i);
  UArg a;
  a.i = axis;
  if (max < 0) max = 0;
  return uop_new(OP_RANGE, DT_INDEX, &end, 1, &max, 1, a);
}

UOp *s_var(int var) {
  int64_t b[2] = {0, 0};
  var_info(var, NULL, &b[0], &b[1]);
  UArg a;
  a.i = var;
  return uop_new(OP_DEFINE_VAR, DT_INDEX, NULL, 0, b, 2, a);
}

typedef struct {
  UOp *t; /* borrowed */
  int64_t k;
} Term;
typedef struct {
  Term *terms;
  int n, cap;
  int64_t c;
} Aff;

static void aff_push(Aff *a, UOp *t, int64_t k) {
  for (int i = 0; i < a->n; i++)
    if (a->terms[i].t == t) {
      a->terms[i].k += k;
      return;
    }
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 8;
    a->terms = tg_xrealloc(a->terms, sizeof(Term) * (size_t)a->cap);
  }
  a->terms[a->n].t = t;
  a->terms[a->n++].k = k;
}

static void aff_add(Aff *a, UOp *u, int64_t k) {
  if (k == 0) return;
  if (u->op == OP_CONST) {
    a->c += k * u->arg.i;
  } else if (u->op == OP_ADD) {
    aff_add(a, u->src[0], k);
    aff_add(a, u->src[1], k);
  } else if (u->op == OP_MUL && u->src[1]->op == OP_CONST) {
    aff_add(a, u->src[0], k * u->src[1]->arg.i);
  } else {
    aff_push(a, u, k);
  }
}

static int term_cmp(const void *x, const void *y) {
  const Term *a = x, *b = y;
  return a->t->id < b->t->id ? -1 : (a->t->id > b->t->id);
}

static UOp *raw2(int op, UOp *a, UOp *b) {
  UOp *s[2] = {a, b};
  UArg z = {0};
  return uop_new(op, (op == OP_CMPLT || op == OP_AND) ? TG_BOOL : DT_INDEX, s, 2, NULL, 0, z);
}

/* Canonical node for an affine sum. Applies (x//c)*c*k + (x%c)*k -> x*k first. */
static UOp *aff_build(Aff *a) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (int i = 0; i < a->n && !changed; i++) {
      UOp *d = a->terms[i].t;
      if (a->terms[i].k == 0 || d->op != OP_IDIV || d->src[1]->op != OP_CONST) continue;
      int64_t c = d->src[1]->arg.i;
      for (int j = 0; j < a->n; j++) {
        UOp *m = a->terms[j].t;
        if (j == i || a->terms[j].k == 0 || m->op != OP_MOD || m->src[0] != d->src[0] || m->src[1] != d->src[1]) continue;
        int64_t km = a->terms[j].k;
        if (a->terms[i].k != km * c) continue;
        a->terms[i].k = 0;
        a->terms[j].k = 0;
        aff_add(a, d->src[0], km);
        changed = true;
        break;
      }
    }
  }
  int n = 0;
  for (int i = 0; i < a->n; i++)
    if (a->terms[i].k != 0) a->terms[n++] = a->terms[i];
  a->n = n;
  if (n > 1) qsort(a->terms, (size_t)n, sizeof(Term), term_cmp); /* terms is NULL when empty */
  UOp *acc = NULL;
  for (int i = 0; i < n; i++) {
    UOp *t = a->terms[i].t;
    UOp *term;
    if (a->terms[i].k == 1) {
      term = uop_ref(t);
    } else {
      UOp *kc = s_const(a->terms[i].k);
      term = raw2(OP_MUL, t, kc);
      uop_unref(kc);
    }
    if (!acc) {
      acc = term;
    } else {
      UOp *nx = raw2(OP_ADD, acc, term);
      uop_unref(acc);
      uop_unref(term);
      acc = nx;
    }
  }
  if (!acc) return s_const(a->c);
  if (a->c != 0) {
    UOp *cc = s_const(a->c);
    UOp *nx = raw2(OP_ADD, acc, cc);
    uop_unref(cc);
    uop_unref(acc);
    acc = nx;
  }
  return acc;
}

static void aff_free(Aff *a) { free(a->terms); }

UOp *s_add(UOp *x, UOp *y) {
  Aff a = {0};
  aff_add(&a, x, 1);
  aff_add(&a, y, 1);
  UOp *r = aff_build(&a);
  aff_free(&a);
  return r;
}
UOp *s_addc(UOp *x, int64_t c) {
  if (c == 0) return uop_ref(x);
  Aff a = {0};
  aff_add(&a, x, 1);
  a.c += c;
  UOp *r = aff_build(&a);
  aff_free(&a);
  return r;
}
UOp *s_mulc(UOp *x, int64_t c) {
  if (c == 1) return uop_ref(x);
  Aff a = {0};
  aff_add(&a, x, c);
  UOp *r = aff_build(&a);
  aff_free(&a);
  return r;
}

static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
  return q;
}
static int64_t floormod(int64_t a, int64_t b) { return a - floordiv(a, b) * b; }

static bool all_terms_nonneg(const Aff *a) {
  for (int i = 0; i < a->n; i++)
    if (a->terms[i].t->vmin < 0) return false;
  return true;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a < 0 ? -a : a;
}

/* For non-negative affine a and c > 1: finds g, 1 < g < c, g | c, with a = g*A + B where B's terms
 * have coefficients that g does not divide and 0 <= B < g. Then a // c == A // (c/g) and
 * a % c == g*(A % (c/g)) + B: (20*y + x) // 40 with x < 20 is y // 2. Returns g, or 0. */
static int64_t split_multiple(const Aff *a, int64_t c, UOp **A, UOp **B) {
  for (int i = 0; i <= a->n; i++) {
    int64_t g = gcd64(i < a->n ? a->terms[i].k : a->c, c);
    if (g <= 1 || g >= c) continue;
    Aff qa = {0}, ra = {0};
    for (int j = 0; j < a->n; j++) {
      if (a->terms[j].k % g == 0) aff_push(&qa, a->terms[j].t, a->terms[j].k / g);
      else aff_push(&ra, a->terms[j].t, a->terms[j].k);
    }
    qa.c = floordiv(a->c, g);
    ra.c = floormod(a->c, g);
    UOp *rb = aff_build(&ra);
    aff_free(&ra);
    if (rb->vmin >= 0 && rb->vmax < g) {
      *A = aff_build(&qa);
      *B = rb;
      aff_free(&qa);
      return g;
    }
    uop_unref(rb);
    aff_free(&qa);
  }
  return 0;
}

UOp *s_divc(UOp *x, int64_t c) {
  TG_ASSERT(c > 0);
  if (c == 1) return uop_ref(x);
  if (x->vmin >= 0 && x->vmax < c) return s_const(0);
  if (x->op == OP_CONST) return s_const(floordiv(x->arg.i, c));
  /* (y // a) // c == y // (a*c) for non-negative y */
  if (x->op == OP_IDIV && x->src[1]->op == OP_CONST && x->src[0]->vmin >= 0)
    return s_divc(x->src[0], x->src[1]->arg.i * c);
  Aff a = {0};
  aff_add(&a, x, 1);
  bool exact = a.c % c == 0;
  for (int i = 0; i < a.n && exact; i++) exact = a.terms[i].k % c == 0;
  UOp *r = NULL;
  if (exact) {
    for (int i = 0; i < a.n; i++) a.terms[i].k /= c;
    a.c /= c;
    r = aff_build(&a);
  } else if (x->vmin >= 0 && all_terms_nonneg(&a)) {
    /* split x = c*Q + R with 0 <= R's coefficients < c */
    Aff q = {0}, rem = {0};
    for (int i = 0; i < a.n; i++) {
      int64_t k = a.terms[i].k, kq = floordiv(k, c), kr = floormod(k, c);
      if (kq) aff_push(&q, a.terms[i].t, kq);
      if (kr) aff_push(&rem, a.terms[i].t, kr);
    }
    q.c = floordiv(a.c, c);
    rem.c = floormod(a.c, c);
    UOp *rn = aff_build(&rem), *sa = NULL, *sb = NULL;
    int64_t g;
    if (rn->vmax < c) {
      r = aff_build(&q);
    } else if ((g = split_multiple(&a, c, &sa, &sb)) != 0) {
      r = s_divc(sa, c / g);
      uop_unref(sa), uop_unref(sb);
    } else {
      UOp *cc = s_const(c);
      UOp *rd = raw2(OP_IDIV, rn, cc);
      uop_unref(cc);
      aff_add(&q, rd, 1);
      r = aff_build(&q);
      uop_unref(rd);
    }
    uop_unref(rn);
    aff_free(&q);
    aff_free(&rem);
  } else {
    UOp *cc = s_const(c);
    r = raw2(OP_IDIV, x, cc);
    uop_unref(cc);
  }
  aff_free(&a);
  return r;
}

UOp *s_modc(UOp *x, int64_t c) {
  TG_ASSERT(c > 0);
  if (c == 1) return s_const(0);
  if (x->vmin >= 0 && x->vmax < c) return uop_ref(x);
  if (x->op == OP_CONST) return s_const(x->arg.i % c);
  UOp *r;
  Aff a = {0};
  aff_add(&a, x, 1);
  if (x->vmin >= 0 && all_terms_nonneg(&a)) {
    Aff rem = {0};
    for (int i = 0; i < a.n; i++) {
      int64_t kr = floormod(a.terms[i].k, c);
      if (kr) aff_push(&rem, a.terms[i].t, kr);
    }
    rem.c = floormod(a.c, c);
    UOp *rn = aff_build(&rem), *sa = NULL, *sb = NULL;
    aff_free(&rem);
    int64_t g;
    if (rn->vmin >= 0 && rn->vmax < c) {
      r = rn;
    } else if ((g = split_multiple(&a, c, &sa, &sb)) != 0) {
      UOp *m = s_modc(sa, c / g), *mg = s_mulc(m, g);
      r = s_add(mg, sb);
      uop_unref(m), uop_unref(mg), uop_unref(sa), uop_unref(sb), uop_unref(rn);
    } else {
      UOp *cc = s_const(c);
      r = raw2(OP_MOD, rn, cc);
      uop_unref(cc);
      uop_unref(rn);
    }
  } else {
    UOp *cc = s_const(c);
    r = raw2(OP_MOD, x, cc);
    uop_unref(cc);
  }
  aff_free(&a);
  return r;
}

static UOp *bool_const(bool v) { return uop_const_i(TG_BOOL, v); }

UOp *s_ltc(UOp *x, int64_t c) {
  if (x->vmax < c) return bool_const(true);
  if (x->vmin >= c) return bool_const(false);
  UOp *cc = s_const(c);
  UOp *r = raw2(OP_CMPLT, x, cc);
  uop_unref(cc);
  return r;
}
UOp *s_gec(UOp *x, int64_t c) {
  if (x->vmin >= c) return bool_const(true);
  if (x->vmax < c) return bool_const(false);
  UOp *cc = s_const(c - 1);
  UOp *r = raw2(OP_CMPLT, cc, x);
  uop_unref(cc);
  return r;
}
UOp *s_lt(UOp *a, UOp *b) {
  if (b->op == OP_CONST) return s_ltc(a, b->arg.i);
  if (a->op == OP_CONST) return s_gec(b, a->arg.i + 1);
  UOp *nb = s_mulc(b, -1), *d = s_add(a, nb);
  UOp *r = s_ltc(d, 0);
  uop_unref(nb), uop_unref(d);
  return r;
}

bool uop_depends_on_memo(const UOp *u, const UOp *r, PtrMap *memo) {
  if (u == r) return true;
  intptr_t m = (intptr_t)pm_get(memo, (uint64_t)(uintptr_t)u);
  if (m) return m == 1;
  bool d = false;
  for (uint32_t i = 0; i < u->nsrc && !d; i++) d = uop_depends_on_memo(u->src[i], r, memo);
  pm_put(memo, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(d ? 1 : 2));
  return d;
}

bool uop_depends_on(const UOp *u, const UOp *r) {
  if (!u) return false;
  PtrMap memo;
  pm_init(&memo);
  bool d = uop_depends_on_memo(u, r, &memo);
  pm_free(&memo);
  return d;
}

static void collect_rec(UOp *u, int op, PtrVec *out, PtrMap *seen) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == op) pv_push(out, u);
  for (uint32_t i = 0; i < u->nsrc; i++) collect_rec(u->src[i], op, out, seen);
}

void uop_collect(UOp *u, int op, PtrVec *out) {
  PtrMap seen;
  pm_init(&seen);
  collect_rec(u, op, out, &seen);
  pm_free(&seen);
}

UOp *s_minc(UOp *x, int64_t c) {
  if (x->vmax <= c) return uop_ref(x);
  if (x->vmin >= c) return s_const(c);
  UOp *lt = s_ltc(x, c), *cc = s_const(c);
  UOp *r = uop_alu(OP_WHERE, DT_INDEX, lt, x, cc);
  uop_unref(lt), uop_unref(cc);
  return r;
}

UOp *s_and(UOp *a, UOp *b) {
  if (!a) return b ? uop_ref(b) : NULL;
  if (!b) return uop_ref(a);
  if (a->op == OP_CONST) return a->arg.i ? uop_ref(b) : uop_ref(a);
  if (b->op == OP_CONST) return b->arg.i ? uop_ref(a) : uop_ref(b);
  if (a == b) return uop_ref(a);
  if (a->id > b->id) {
    UOp *t = a;
    a = b, b = t;
  }
  return raw2(OP_AND, a, b);
}

/* ---- substitution with re-simplification ---- */
static UOp *subst_rec(UOp *u, PtrMap *memo) {
  UOp *m = pm_get(memo, (uint64_t)(uintptr_t)u);
  if (m) return uop_ref(m);
  UOp *r;
  if (u->nsrc == 0) {
    r = uop_ref(u);
  } else {
    UOp *ns[8], **srcs = u->nsrc <= 8 ? ns : tg_xmalloc(sizeof(UOp *) * u->nsrc);
    bool same = true;
    for (uint32_t i = 0; i < u->nsrc; i++) {
      srcs[i] = subst_rec(u->src[i], memo);
      same = same && srcs[i] == u->src[i];
    }
    if (same) {
      r = uop_ref(u);
    } else if (u->dtype == DT_INDEX && u->op == OP_ADD) {
      r = s_add(srcs[0], srcs[1]);
    } else if (u->dtype == DT_INDEX && u->op == OP_MUL && srcs[1]->op == OP_CONST) {
      r = s_mulc(srcs[0], srcs[1]->arg.i);
    } else if (u->dtype == DT_INDEX && u->op == OP_IDIV && srcs[1]->op == OP_CONST && srcs[1]->arg.i > 0) {
      r = s_divc(srcs[0], srcs[1]->arg.i);
    } else if (u->dtype == DT_INDEX && u->op == OP_MOD && srcs[1]->op == OP_CONST && srcs[1]->arg.i > 0) {
      r = s_modc(srcs[0], srcs[1]->arg.i);
    } else if (u->op == OP_CMPLT && u->dtype == TG_BOOL && srcs[1]->op == OP_CONST && srcs[0]->dtype == DT_INDEX) {
      r = s_ltc(srcs[0], srcs[1]->arg.i);
    } else if (u->op == OP_CMPLT && u->dtype == TG_BOOL && srcs[0]->op == OP_CONST && srcs[1]->dtype == DT_INDEX) {
      r = s_gec(srcs[1], srcs[0]->arg.i + 1);
    } else if (u->op == OP_AND && u->dtype == TG_BOOL) {
      r = s_and(srcs[0], srcs[1]);
    } else {
      r = uop_new(u->op, (tg_dtype)u->dtype, srcs, (int)u->nsrc, u->iarg, (int)u->niarg, u->arg);
    }
    for (uint32_t i = 0; i < u->nsrc; i++) uop_unref(srcs[i]);
    if (srcs != ns) free(srcs);
  }
  pm_put(memo, (uint64_t)(uintptr_t)u, r); /* the memo owns one reference, the caller another */
  return uop_ref(r);
}

UOp *uop_substitute(UOp *u, const USubst *subst, int n) {
  PtrMap memo;
  pm_init(&memo);
  for (int i = 0; i < n; i++) pm_put(&memo, (uint64_t)(uintptr_t)subst[i].from, uop_ref(subst[i].to));
  UOp *r = subst_rec(u, &memo);
  for (size_t i = 0; i < memo.cap; i++)
    if (memo.keys[i]) uop_unref(memo.vals[i]);
  pm_free(&memo);
  return r;
}

static void print_rec(const UOp *u, int depth) {
  fprintf(stderr, "%*s%s %s", depth * 2, "", op_names[u->op], tg_dtype_name((tg_dtype)u->dtype));
  if (u->op == OP_CONST) fprintf(stderr, " %g", uop_const_as_f(u));
  if (u->niarg) {
    fprintf(stderr, " (");
    for (uint32_t i = 0; i < u->niarg; i++) fprintf(stderr, "%s%lld", i ? "," : "", (long long)u->iarg[i]);
    fprintf(stderr, ")");
  }
  fprintf(stderr, "\n");
  for (uint32_t i = 0; i < u->nsrc; i++) print_rec(u->src[i], depth + 1);
}
void uop_print(const UOp *u) { print_rec(u, 0); }
