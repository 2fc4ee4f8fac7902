/*
 * torch_load.c -- PyTorch checkpoints (torch.save) read without Python and without executing
 * anything: tinygrad's torch_load, returned as a flattened tg_state_dict.
 *
 * In: a file in either of torch.save's formats --
 *   zip (the default since 1.6): <archive>/data.pkl, the object pickle; <archive>/data/<key>, the raw
 *     bytes of each storage; <archive>/byteorder ("little" or "big", optional);
 *   legacy (_use_new_zipfile_serialization=False): five pickles back to back -- a magic number, the
 *     protocol version (1001), a sys-info dict, the object, the sorted list of storage keys -- then
 *     each storage as an int64 element count followed by its bytes.
 * Out: every tensor reachable from the object, materialized row-major and contiguous (strided views
 *   and storage offsets applied), named by its path with dots ({"model": {"fc.weight": t}} ->
 *   "model.fc.weight"; list items by index; a bare tensor is named "tensor"). Non-tensor values on
 *   the way (epoch numbers, hyper-parameters) become metadata text in Python repr style, at most
 *   4 KiB each and 16 MiB in all.
 *
 * The unpickler is a small stack machine over a restricted object model (None, bool, int, float,
 * str, bytes, tuple, list, dict, set, storage, tensor, and tokens for allow-listed globals). GLOBAL
 * resolves names against a fixed allow-list and REDUCE/NEWOBJ only apply the tensor-rebuild
 * functions of that list, implemented here; any other global is rejected as soon as it is named, so
 * nothing a file says is ever executed. Invariants: every read is bounds-checked against the pickle;
 * objects are owned by one list and freed together (shared and cyclic references are harmless); the
 * machine never recurses, and the walks over the result (flattening, repr) are depth-limited; memory
 * is bounded by a multiple of the file's size (views that repeat storage elements may materialize at
 * most 8x the storage bytes + 64 MiB in all; names, entries and metadata are capped).
 *
 * pickle_fields_mem (loaders.h) runs the same machine over a plain pickle of a dict holding numpy
 * arrays and lists of ints (CIFAR-10's python batches): with it, and only with it, the allow-list
 * also takes numpy's array and dtype reconstructors (_reconstruct + BUILD, and protocol 5's
 * _frombuffer), which make array objects over bytes in the pickle, checked against their shape and
 * dtype.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "loaders.h"
#include "state_dict.h"
#include "zip.h"

#define FN "tg_torch_load"
#define MAX_DEPTH 100              /* nesting of containers on the way to a tensor */
#define MAX_NAME 4096              /* bytes in one flattened name */
#define MAX_VISITS (1u << 22)      /* container/tensor visits while flattening */
#define META_VALUE_MAX 4096        /* bytes of one metadata value */
#define META_TOTAL_MAX (16u << 20) /* bytes of metadata in all */
#define EXPAND_SLACK (64ull << 20) /* extra bytes views may materialize beyond 8x the storages */
#define MAX_NDIM 64
#define OBJ_CHUNK 1024
/* The unpickler's memory (objects, stacks, memo, containers, tensor records) may reach MEM_FACTOR x
 * the pickle's bytes + MEM_SLACK. A pickle torch writes needs 10-15x (measured); a file made
 * only to fill memory (millions of 1-byte opcodes that each create an object) is stopped there.
 * For a deflated data.pkl the base is the smaller of the pickle and the whole file, so a small
 * file cannot inflate into a large budget. */
#define MEM_FACTOR 32
#define MEM_SLACK (4ull << 20)

/* ---- object model ---------------------------------------------------------------------------- */

typedef enum {
  PK_NONE,
  PK_BOOL,
  PK_INT,
  PK_BIGINT, /* an integer wider than 64 bits: kept as its little-endian bytes (the legacy magic) */
  PK_FLOAT,
  PK_STR,
  PK_BYTES,
  PK_TUPLE,
  PK_LIST,
  PK_SET,
  PK_DICT,
  PK_GLOBAL,
  PK_STORAGE,
  PK_TENSOR,
  PK_NDARRAY, /* numpy array (pickle_fields_mem only): own is an NpArray */
  PK_NPDTYPE, /* numpy dtype: own is an NpDtype */
} PkKind;

typedef enum {
  G_ORDERED_DICT,
  G_REBUILD_TENSOR_V2,
  G_REBUILD_PARAMETER,
  G_REBUILD_PARAMETER_STATE,
  G_REBUILD_FROM_TYPE_V2,
  G_TENSOR_TYPE,
  G_STORAGE_TYPE,
  G_CODECS_ENCODE,
  G_TORCH_SIZE,
  G_TORCH_DTYPE,
  G_NP_RECONSTRUCT, /* numpy globals: pickle_fields_mem only */
  G_NP_NDARRAY,
  G_NP_DTYPE,
  G_NP_FROMBUFFER,
} GlobalId;

/* The allow-list: the only names a pickle may reference. */
static const struct {
  const char *module, *name;
  GlobalId id;
  tg_dtype dt;
} k_globals[] = {
    {"collections", "OrderedDict", G_ORDERED_DICT, 0},
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_TENSOR_V2, 0},
    {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAMETER, 0},
    {"torch._utils", "_rebuild_parameter_with_state", G_REBUILD_PARAMETER_STATE, 0},
    {"torch._tensor", "_rebuild_from_type_v2", G_REBUILD_FROM_TYPE_V2, 0},
    {"torch", "Tensor", G_TENSOR_TYPE, 0},
    {"torch.nn.parameter", "Parameter", G_TENSOR_TYPE, 0},
    {"torch", "FloatStorage", G_STORAGE_TYPE, TG_FLOAT32},
    {"torch", "DoubleStorage", G_STORAGE_TYPE, TG_FLOAT64},
    {"torch", "HalfStorage", G_STORAGE_TYPE, TG_FLOAT16},
    {"torch", "BFloat16Storage", G_STORAGE_TYPE, TG_BFLOAT16},
    {"torch", "LongStorage", G_STORAGE_TYPE, TG_INT64},
    {"torch", "IntStorage", G_STORAGE_TYPE, TG_INT32},
    {"torch", "ShortStorage", G_STORAGE_TYPE, TG_INT16},
    {"torch", "CharStorage", G_STORAGE_TYPE, TG_INT8},
    {"torch", "ByteStorage", G_STORAGE_TYPE, TG_UINT8},
    {"torch", "BoolStorage", G_STORAGE_TYPE, TG_BOOL},
    {"torch", "UntypedStorage", G_STORAGE_TYPE, TG_UINT8},
    /* protocol 2 pickles bytes objects as _codecs.encode(text, 'latin1'): a pure function */
    {"_codecs", "encode", G_CODECS_ENCODE, 0},
    /* values torch's own weights_only loader takes: a shape (torch.Size(tuple) is the tuple) and a
     * dtype (metadata: its name) */
    {"torch", "Size", G_TORCH_SIZE, 0},
    {"torch", "float16", G_TORCH_DTYPE, 0}, {"torch", "float32", G_TORCH_DTYPE, 0},
    {"torch", "float64", G_TORCH_DTYPE, 0}, {"torch", "bfloat16", G_TORCH_DTYPE, 0},
    {"torch", "int8", G_TORCH_DTYPE, 0}, {"torch", "int16", G_TORCH_DTYPE, 0},
    {"torch", "int32", G_TORCH_DTYPE, 0}, {"torch", "int64", G_TORCH_DTYPE, 0},
    {"torch", "uint8", G_TORCH_DTYPE, 0}, {"torch", "bool", G_TORCH_DTYPE, 0},
    {"torch", "complex64", G_TORCH_DTYPE, 0}, {"torch", "complex128", G_TORCH_DTYPE, 0},
    /* numpy arrays (numpy 1.x and 2.x module names), allowed in pickle_fields_mem only */
    {"numpy.core.multiarray", "_reconstruct", G_NP_RECONSTRUCT, 0},
    {"numpy._core.multiarray", "_reconstruct", G_NP_RECONSTRUCT, 0},
    {"numpy", "ndarray", G_NP_NDARRAY, 0},
    {"numpy", "dtype", G_NP_DTYPE, 0},
    {"numpy.core.numeric", "_frombuffer", G_NP_FROMBUFFER, 0},
    {"numpy._core.numeric", "_frombuffer", G_NP_FROMBUFFER, 0},
};

#define NP_MAX_NDIM 32
/* a numpy dtype: its type string ("u1", "f4"), byte order ('|', '<', '=', '>'; '|' until BUILD) */
typedef struct {
  char str[8];
  char order;
} NpDtype;
/* a numpy array: set once its shape, dtype and bytes are known (BUILD after _reconstruct) */
typedef struct {
  bool set;
  NpDtype dt;
  int ndim;
  int64_t shape[NP_MAX_NDIM];
  const uint8_t *data; /* nbytes, in the pickle or in a bytes object's own */
  uint64_t nbytes;
} NpArray;

typedef struct Storage Storage;
struct Storage {
  const uint8_t *key; /* in the pickle */
  size_t keylen;
  tg_dtype dt;
  uint64_t numel;
  const uint8_t *data; /* numel * itemsize bytes once resolved, else NULL */
  Storage *base;       /* legacy storage view: elements [base_off, base_off + numel) of base */
  uint64_t base_off;
  void *owned;         /* inflated zip member */
  uint32_t nref, nused; /* tensors over this root storage (views included), and those materialized */
};

typedef struct {
  Storage *st;
  int64_t offset;
  int ndim;
  int64_t *shape, *stride; /* ndim each, in dims[] */
  tg_tensor handle;        /* materialized value (owned here, freed at the end) */
  int64_t dims[];          /* sized to ndim: a REDUCE costs memory in proportion to its dimensions */
} TensorDesc;

typedef struct PkObj PkObj;
struct PkObj {
  uint8_t kind;
  uint8_t has_tensor; /* contains_tensor cache: 0 unknown, 1 in progress, 2 no, 3 yes */
  void *own;          /* extra allocation freed with the object (bytes, tensor descriptor) */
  union {
    bool b;
    int64_t i;
    double f;
    struct {
      const uint8_t *p;
      size_t n;
    } s; /* str, bytes, bigint */
    struct {
      PkObj **v;
      size_t n, cap;
    } seq; /* tuple, list, set */
    struct {
      PkObj **k, **v;
      size_t n, cap;
    } d;
    int g; /* index into k_globals */
    Storage *st;
    TensorDesc *t;
  } u;
};

/* uint64 -> pointer open-addressing map (memo, storages by key hash) */
typedef struct {
  uint64_t *keys;
  void **vals;
  size_t cap, n;
} Map;

typedef struct {
  const char *fn, *path;
  const uint8_t *file;
  size_t file_len;
  char err[640];
  bool failed;
  PkObj **chunks; /* objects live in chunks of OBJ_CHUNK, freed together */
  size_t nobjs, nchunks;
  PkObj *none, *yes, *no; /* None, True and False are immutable: one object each */
  PkObj *small_int[256];  /* so are ints: BININT1's values are shared too */
  uint64_t mem, mem_budget; /* bytes the unpickler holds, and the most it may (see charge) */
  Storage **sts;
  size_t nst, capst;
  Map st_by_key;
  uint64_t key_seed;
  ZipArchive zip;
  bool have_zip;
  char prefix[256]; /* zip archive directory ("archive") */
  bool legacy, swap;
  uint64_t storage_bytes, materialized_bytes;
  size_t n_tensors, n_entries, visits, meta_bytes;
  tg_state_dict *sd;
  bool numpy; /* pickle_fields_mem: numpy's reconstructors are allowed */
} Ctx;

static void *cfail(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *cfail(Ctx *c, const char *fmt, ...) {
  if (!c->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->failed = true;
  }
  return NULL;
}

/* Copies s[0..n) for a message: printable ASCII only, at most max bytes. */
static const char *printable(char *buf, size_t cap, const uint8_t *s, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < cap; i++) buf[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
  if (n && o + 4 >= cap) buf[o++] = '.', buf[o++] = '.', buf[o++] = '.';
  buf[o] = 0;
  return buf;
}

static void map_free(Map *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}
static uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  return k ^ (k >> 33);
}
/* Key 0 is reserved for "empty": callers store key + 1. */
static void **map_slot(Map *m, uint64_t key, bool insert) {
  if (insert && (m->n + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uint64_t *nk = tg_xcalloc(ncap, sizeof *nk);
    void **nv = tg_xcalloc(ncap, sizeof *nv);
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t h = mix64(m->keys[i]) & (ncap - 1);
      while (nk[h]) h = (h + 1) & (ncap - 1);
      nk[h] = m->keys[i];
      nv[h] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
  }
  if (!m->cap) return NULL;
  size_t h = mix64(key) & (m->cap - 1);
  while (m->keys[h] && m->keys[h] != key) h = (h + 1) & (m->cap - 1);
  if (!m->keys[h]) {
    if (!insert) return NULL;
    m->keys[h] = key;
    m->n++;
  }
  return &m->vals[h];
}

/* Accounts n more bytes of unpickler memory; false (and the load fails) past the budget. The
 * machine checks c->failed after every opcode, so an allocation already made is only the last. */
static bool charge(Ctx *c, uint64_t n) {
  c->mem += n;
  if (c->mem <= c->mem_budget) return true;
  if (!c->failed)
    cfail(c,
          "the pickle needs more than %" PRIu64 " bytes of memory (%dx its size + %llu MiB): a hostile or "
          "corrupt file?",
          c->mem_budget, MEM_FACTOR, MEM_SLACK >> 20);
  return false;
}

static PkObj *new_obj(Ctx *c, PkKind kind) {
  if (c->nobjs == c->nchunks * OBJ_CHUNK) {
    c->chunks = tg_xrealloc(c->chunks, (c->nchunks + 1) * sizeof *c->chunks);
    c->chunks[c->nchunks++] = tg_xcalloc(OBJ_CHUNK, sizeof(PkObj));
    charge(c, OBJ_CHUNK * sizeof(PkObj) + sizeof(PkObj *));
  }
  PkObj *o = &c->chunks[c->nobjs / OBJ_CHUNK][c->nobjs % OBJ_CHUNK];
  c->nobjs++;
  o->kind = (uint8_t)kind;
  return o;
}

static PkObj *obj_at(const Ctx *c, size_t i) { return &c->chunks[i / OBJ_CHUNK][i % OBJ_CHUNK]; }

/* The shared None / True / False. */
static PkObj *const_obj(Ctx *c, PkKind kind, bool b) {
  PkObj **slot = kind == PK_NONE ? &c->none : b ? &c->yes : &c->no;
  if (!*slot) {
    *slot = new_obj(c, kind);
    (*slot)->u.b = b;
  }
  return *slot;
}

static void free_obj(PkObj *o) {
  switch (o->kind) {
  case PK_TUPLE:
  case PK_LIST:
  case PK_SET:
    free(o->u.seq.v);
    break;
  case PK_DICT:
    free(o->u.d.k);
    free(o->u.d.v);
    break;
  case PK_TENSOR:
    tg_free(o->u.t->handle);
    break;
  default:
    break;
  }
  free(o->own);
}

static void seq_push(Ctx *c, PkObj *o, PkObj *v) {
  if (o->u.seq.n == o->u.seq.cap) {
    /* from one slot up: a pickle may nest a million one-item lists (each charged) */
    size_t ncap = o->u.seq.cap ? o->u.seq.cap * 2 : 1;
    charge(c, (ncap - o->u.seq.cap) * sizeof(PkObj *));
    o->u.seq.cap = ncap;
    o->u.seq.v = tg_xrealloc(o->u.seq.v, o->u.seq.cap * sizeof(PkObj *));
  }
  o->u.seq.v[o->u.seq.n++] = v;
}

/* Python dict semantics would replace a repeated key; a pickler never writes one, so entries are
 * appended and a repeat surfaces later as a duplicate name. */
static void dict_put(Ctx *c, PkObj *o, PkObj *k, PkObj *v) {
  if (o->u.d.n == o->u.d.cap) {
    size_t ncap = o->u.d.cap ? o->u.d.cap * 2 : 1;
    charge(c, (ncap - o->u.d.cap) * 2 * sizeof(PkObj *));
    o->u.d.cap = ncap;
    o->u.d.k = tg_xrealloc(o->u.d.k, o->u.d.cap * sizeof(PkObj *));
    o->u.d.v = tg_xrealloc(o->u.d.v, o->u.d.cap * sizeof(PkObj *));
  }
  o->u.d.k[o->u.d.n] = k;
  o->u.d.v[o->u.d.n++] = v;
}

static const char *kind_name(const PkObj *o) {
  static const char *names[] = {"None", "bool",   "int",     "big int (past 64 bits)", "float", "str",
                                "bytes", "tuple", "list",    "set",    "dict",          "global",
                                "storage", "tensor", "numpy array", "numpy dtype"};
  return names[o->kind];
}

static bool is_str(const PkObj *o, const char *s) {
  return o->kind == PK_STR && o->u.s.n == strlen(s) && memcmp(o->u.s.p, s, o->u.s.n) == 0;
}

/* ---- storages -------------------------------------------------------------------------------- */

static Storage *storage_find(Ctx *c, const uint8_t *key, size_t n) {
  uint64_t h = hash_bytes(key, n, c->key_seed) | 1;
  for (;; h += 2) { /* probe by distinct hash keys: collisions chain through h, h+2, ... */
    void **slot = map_slot(&c->st_by_key, h, false);
    if (!slot) return NULL;
    Storage *s = *slot;
    if (s->keylen == n && memcmp(s->key, key, n) == 0) return s;
  }
}

static void storage_add(Ctx *c, Storage *s) {
  uint64_t h = hash_bytes(s->key, s->keylen, c->key_seed) | 1;
  void **slot;
  while ((slot = map_slot(&c->st_by_key, h, false)) != NULL) h += 2;
  *map_slot(&c->st_by_key, h, true) = s;
  if (c->nst == c->capst) {
    c->capst = c->capst ? c->capst * 2 : 16;
    c->sts = tg_xrealloc(c->sts, c->capst * sizeof *c->sts);
  }
  c->sts[c->nst++] = s;
}

/* Zip format: the storage's bytes are the member <prefix>/data/<key>. */
static bool storage_resolve_zip(Ctx *c, Storage *s) {
  char name[512], kb[200];
  if (s->keylen > 200) return cfail(c, "storage key is too long (%zu bytes)", s->keylen), false;
  snprintf(name, sizeof name, "%s/data/%.*s", c->prefix, (int)s->keylen, (const char *)s->key);
  if (memchr(s->key, 0, s->keylen)) return cfail(c, "storage key contains a NUL byte"), false;
  const ZipEntry *e = zip_find(&c->zip, name);
  if (!e)
    return cfail(c, "storage '%s' is missing from the archive (no member %s/data/%s)",
                 printable(kb, sizeof kb, s->key, s->keylen), c->prefix, kb),
           false;
  const uint8_t *p;
  size_t n;
  char zerr[300];
  size_t need = (size_t)s->numel * tg_dtype_itemsize(s->dt);
  /* inflate only what the storage holds: a huge member behind a small storage is never expanded */
  if (zip_read(&c->zip, e, need, &p, &n, &s->owned, zerr, sizeof zerr) != 0) return cfail(c, "%s", zerr), false;
  if (n < need)
    return cfail(c, "storage '%s' holds %zu bytes but %" PRIu64 " %s elements need %zu",
                 printable(kb, sizeof kb, s->key, s->keylen), n, s->numel, tg_dtype_name(s->dt), need),
           false;
  s->data = p;
  return true;
}

/* persistent_load: ('storage', <storage type>, key, location, numel[, view_metadata]) */
static PkObj *persistent_load(Ctx *c, PkObj *pid) {
  if (pid->kind != PK_TUPLE || pid->u.seq.n < 5 || !is_str(pid->u.seq.v[0], "storage"))
    return cfail(c, "unsupported persistent id (expected a ('storage', type, key, location, numel) tuple)");
  PkObj **a = pid->u.seq.v;
  if (pid->u.seq.n != (c->legacy ? 6u : 5u))
    return cfail(c, "persistent id has %zu fields, expected %d", pid->u.seq.n, c->legacy ? 6 : 5);
  if (a[1]->kind != PK_GLOBAL || k_globals[a[1]->u.g].id != G_STORAGE_TYPE)
    return cfail(c, "persistent id names no storage type");
  if (a[2]->kind != PK_STR) return cfail(c, "storage key is a %s, not a str", kind_name(a[2]));
  if (a[4]->kind != PK_INT || a[4]->u.i < 0) return cfail(c, "storage size is not a non-negative int");
  tg_dtype dt = k_globals[a[1]->u.g].dt;
  uint64_t numel = (uint64_t)a[4]->u.i;
  char kb[200];
  if (numel > (UINT64_C(1) << 48)) /* the bytes themselves are checked when the storage is found */
    return cfail(c, "storage '%s' declares %" PRIu64 " elements, too many",
                 printable(kb, sizeof kb, a[2]->u.s.p, a[2]->u.s.n), numel);
  Storage *s = storage_find(c, a[2]->u.s.p, a[2]->u.s.n);
  if (s) {
    if (s->dt != dt || s->numel != numel)
      return cfail(c, "storage '%s' is referenced with two different types or sizes",
                   printable(kb, sizeof kb, s->key, s->keylen));
  } else {
    if (!charge(c, sizeof *s + 4 * sizeof(void *))) return NULL; /* the record and its key-map share */
    s = tg_xcalloc(1, sizeof *s);
    s->key = a[2]->u.s.p;
    s->keylen = a[2]->u.s.n;
    s->dt = dt;
    s->numel = numel;
    storage_add(c, s);
    if (!c->legacy && !storage_resolve_zip(c, s)) return NULL;
    c->storage_bytes += numel * tg_dtype_itemsize(dt);
  }
  if (c->legacy && a[5]->kind != PK_NONE) {
    /* an old-style storage view: (view_key, offset, size) in elements of the root storage. torch
     * only ever writes views of root storages; a view of a view would let a file build a chain of
     * any length, so it is refused and views stay one level deep. */
    PkObj *vm = a[5];
    if (s->base)
      return cfail(c, "storage '%s' is a view and cannot be the base of another view (a hostile file?)",
                   printable(kb, sizeof kb, s->key, s->keylen));
    if (vm->kind != PK_TUPLE || vm->u.seq.n != 3 || vm->u.seq.v[0]->kind != PK_STR ||
        vm->u.seq.v[1]->kind != PK_INT || vm->u.seq.v[2]->kind != PK_INT)
      return cfail(c, "malformed storage view metadata");
    int64_t off = vm->u.seq.v[1]->u.i, sz = vm->u.seq.v[2]->u.i;
    if (off < 0 || sz < 0 || (uint64_t)off > numel || (uint64_t)sz > numel - (uint64_t)off)
      return cfail(
          c, "storage view [%" PRId64 ", +%" PRId64 ") lies outside its storage of %" PRIu64 " elements", off,
          sz, numel);
    Storage *v = storage_find(c, vm->u.seq.v[0]->u.s.p, vm->u.seq.v[0]->u.s.n);
    if (v) {
      if (v->base != s || v->base_off != (uint64_t)off || v->numel != (uint64_t)sz)
        return cfail(c, "storage view key reused inconsistently");
    } else {
      if (!charge(c, sizeof *v + 4 * sizeof(void *))) return NULL;
      v = tg_xcalloc(1, sizeof *v);
      v->key = vm->u.seq.v[0]->u.s.p;
      v->keylen = vm->u.seq.v[0]->u.s.n;
      v->dt = dt;
      v->numel = (uint64_t)sz;
      v->base = s;
      v->base_off = (uint64_t)off;
      storage_add(c, v);
    }
    s = v;
  }
  PkObj *o = new_obj(c, PK_STORAGE);
  o->u.st = s;
  return o;
}

/* ---- callables (REDUCE / NEWOBJ) --------------------------------------------------------------- */

static bool get_int_tuple(Ctx *c, PkObj *o, const char *what, int64_t *out, int *n) {
  if (o->kind != PK_TUPLE && o->kind != PK_LIST)
    return cfail(c, "tensor %s is a %s, not a tuple", what, kind_name(o)), false;
  if (o->u.seq.n > MAX_NDIM)
    return cfail(c, "tensor has %zu dimensions (at most %d are supported)", o->u.seq.n, MAX_NDIM), false;
  for (size_t i = 0; i < o->u.seq.n; i++) {
    PkObj *v = o->u.seq.v[i];
    if (v->kind != PK_INT || v->u.i < 0)
      return cfail(c, "tensor %s has an entry that is not a non-negative int", what), false;
    out[i] = v->u.i;
  }
  *n = (int)o->u.seq.n;
  return true;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]) */
static PkObj *rebuild_tensor(Ctx *c, PkObj **a, size_t n) {
  if (n != 6 && n != 7) return cfail(c, "_rebuild_tensor_v2 takes 6 or 7 arguments, got %zu", n);
  if (a[0]->kind != PK_STORAGE)
    return cfail(c, "_rebuild_tensor_v2: argument 1 is a %s, not a storage", kind_name(a[0]));
  if (a[1]->kind != PK_INT || a[1]->u.i < 0)
    return cfail(c, "_rebuild_tensor_v2: storage offset is not a non-negative int");
  int64_t shape[MAX_NDIM], stride[MAX_NDIM];
  int ns, nst;
  if (!get_int_tuple(c, a[2], "size", shape, &ns) || !get_int_tuple(c, a[3], "stride", stride, &nst))
    return NULL;
  if (ns != nst) return cfail(c, "tensor size has %d dimensions but stride has %d", ns, nst);
  size_t tsz = sizeof(TensorDesc) + 2 * (size_t)ns * sizeof(int64_t);
  if (!charge(c, tsz)) return NULL;
  TensorDesc *t = tg_xcalloc(1, tsz);
  PkObj *o = new_obj(c, PK_TENSOR);
  o->own = t;
  o->u.t = t;
  t->st = a[0]->u.st;
  t->offset = a[1]->u.i;
  t->ndim = ns;
  t->shape = t->dims;
  t->stride = t->dims + ns;
  if (ns) {
    memcpy(t->shape, shape, (size_t)ns * sizeof(int64_t));
    memcpy(t->stride, stride, (size_t)ns * sizeof(int64_t));
  }
  /* the view must lie inside its storage: offset + sum((size - 1) * stride) < numel */
  uint64_t numel = 1, nonzero = 1, last = (uint64_t)t->offset;
  for (int i = 0; i < ns; i++) { /* a zero dimension does not excuse the others (tg_from_data's rule) */
    uint64_t v = (uint64_t)t->shape[i];
    if ((v && __builtin_mul_overflow(nonzero, v, &nonzero)) || nonzero > (UINT64_C(1) << 48))
      return cfail(c, "tensor shape is too large (its non-zero dimensions multiply past 2^48)");
    numel *= v;
  }
  if (numel > 0) {
    for (int i = 0; i < ns; i++) {
      uint64_t span;
      if (__builtin_mul_overflow((uint64_t)(t->shape[i] - 1), (uint64_t)t->stride[i], &span) ||
          __builtin_add_overflow(last, span, &last))
        return cfail(c, "tensor view is too large");
    }
    if (last >= t->st->numel)
      return cfail(c,
                   "tensor view (offset %" PRId64 ", last element %" PRIu64
                   ") lies outside its storage of %" PRIu64 " elements",
                   t->offset, last, t->st->numel);
  }
  c->n_tensors++;
  Storage *root = t->st->base ? t->st->base : t->st;
  root->nref++;
  return o;
}

/* latin-1 text (UTF-8 in the pickle) -> bytes */
static PkObj *codecs_encode(Ctx *c, PkObj **a, size_t n) {
  if (n < 1 || n > 2 || a[0]->kind != PK_STR) return cfail(c, "_codecs.encode: unsupported arguments");
  if (n == 2 && !is_str(a[1], "latin1") && !is_str(a[1], "latin-1"))
    return cfail(c, "_codecs.encode: only latin1 is supported");
  const uint8_t *p = a[0]->u.s.p;
  size_t len = a[0]->u.s.n, o = 0;
  if (!charge(c, len)) return NULL;
  uint8_t *buf = tg_xmalloc(len ? len : 1);
  for (size_t i = 0; i < len;) {
    if (p[i] < 0x80) {
      buf[o++] = p[i++];
    } else if ((p[i] == 0xC2 || p[i] == 0xC3) && i + 1 < len && (p[i + 1] & 0xC0) == 0x80) {
      buf[o++] = (uint8_t)(((p[i] & 0x03) << 6) | (p[i + 1] & 0x3F));
      i += 2;
    } else {
      free(buf);
      return cfail(c, "_codecs.encode: text is not latin-1");
    }
  }
  PkObj *r = new_obj(c, PK_BYTES);
  r->own = buf;
  r->u.s.p = buf;
  r->u.s.n = o;
  return r;
}

/* ---- numpy arrays (pickle_fields_mem) -------------------------------------------------------- */

/* A dtype from its type string ("u1", "<f4", "|b1"): kinds b, i, u, f of 1, 2, 4 or 8 bytes. */
static bool np_dtype_parse(Ctx *c, PkObj *s, NpDtype *d) {
  char tb[40];
  if ((s->kind != PK_STR && s->kind != PK_BYTES) || s->u.s.n < 2 || s->u.s.n > 3)
    return cfail(c, "numpy dtype: unsupported type '%s'",
                 s->kind == PK_STR || s->kind == PK_BYTES ? printable(tb, sizeof tb, s->u.s.p, s->u.s.n) : kind_name(s)),
           false;
  const uint8_t *p = s->u.s.p;
  size_t n = s->u.s.n;
  memset(d, 0, sizeof *d);
  d->order = '|';
  if (n == 3) d->order = (char)*p++, n--;
  bool size_ok = p[1] == '1' || p[1] == '2' || p[1] == '4' || p[1] == '8';
  if (!strchr("<>|=", d->order) || !strchr("biuf", p[0]) || !p[0] || !size_ok || (p[0] == 'b' && p[1] != '1') ||
      (p[0] == 'f' && p[1] == '1'))
    return cfail(c, "numpy dtype: unsupported type '%s'", printable(tb, sizeof tb, s->u.s.p, s->u.s.n)), false;
  d->str[0] = (char)p[0], d->str[1] = (char)p[1];
  return true;
}

static uint64_t np_itemsize(const NpDtype *d) { return (uint64_t)(d->str[1] - '0'); }

/* Fills a from its shape (a tuple of ints), dtype and bytes (bytes, or a Python 2 str), checking that
 * the bytes are exactly what the shape and dtype need. */
static bool np_set(Ctx *c, NpArray *a, PkObj *shape, PkObj *dt, PkObj *raw) {
  if (a->set) return cfail(c, "corrupt pickle: a numpy array is built twice"), false;
  if ((shape->kind != PK_TUPLE && shape->kind != PK_LIST) || shape->u.seq.n > NP_MAX_NDIM)
    return cfail(c, "numpy array: the shape is a %s of %zu entries", kind_name(shape), shape->u.seq.n), false;
  if (dt->kind != PK_NPDTYPE) return cfail(c, "numpy array: the dtype is a %s", kind_name(dt)), false;
  a->dt = *(NpDtype *)dt->own;
  uint64_t isz = np_itemsize(&a->dt), numel = 1, nz = 1;
  if (a->dt.order == '>' && isz > 1) return cfail(c, "numpy array: big-endian data is not supported"), false;
  a->ndim = (int)shape->u.seq.n;
  for (int i = 0; i < a->ndim; i++) {
    PkObj *v = shape->u.seq.v[i];
    if (v->kind != PK_INT || v->u.i < 0) return cfail(c, "numpy array: shape entry %d is not a size", i), false;
    a->shape[i] = v->u.i;
    if ((v->u.i && __builtin_mul_overflow(nz, (uint64_t)v->u.i, &nz)) || nz > (UINT64_C(1) << 48))
      return cfail(c, "numpy array: the shape is too large"), false;
    numel *= (uint64_t)v->u.i;
  }
  if (raw->kind != PK_BYTES && raw->kind != PK_STR)
    return cfail(c, "numpy array: the data is a %s, not bytes (object arrays are not supported)", kind_name(raw)),
           false;
  if (raw->u.s.n != numel * isz)
    return cfail(c, "numpy array: shape and dtype need %" PRIu64 " bytes of data but the pickle has %zu",
                 numel * isz, raw->u.s.n),
           false;
  a->data = raw->u.s.p;
  a->nbytes = raw->u.s.n;
  a->set = true;
  return true;
}

static PkObj *new_ndarray(Ctx *c) {
  PkObj *o = new_obj(c, PK_NDARRAY);
  charge(c, sizeof(NpArray));
  o->own = tg_xcalloc(1, sizeof(NpArray));
  return o;
}

/* BUILD on a numpy array: (version, shape, dtype, is_fortran, data); on a dtype: (version, byteorder,
 * ...) */
static bool np_build(Ctx *c, PkObj *obj, PkObj *state) {
  if (state->kind != PK_TUPLE) return cfail(c, "corrupt pickle: a numpy %s's state is a %s", obj->kind == PK_NDARRAY ? "array" : "dtype", kind_name(state)), false;
  PkObj **s = state->u.seq.v;
  size_t n = state->u.seq.n;
  if (obj->kind == PK_NPDTYPE) {
    if (n < 2 || (s[1]->kind != PK_STR && s[1]->kind != PK_BYTES) || s[1]->u.s.n != 1 || !strchr("<>|=", s[1]->u.s.p[0]) ||
        !s[1]->u.s.p[0])
      return cfail(c, "numpy dtype: unsupported state"), false;
    ((NpDtype *)obj->own)->order = (char)s[1]->u.s.p[0];
    return true;
  }
  if (n != 5 || s[0]->kind != PK_INT || (s[3]->kind != PK_BOOL && s[3]->kind != PK_INT))
    return cfail(c, "numpy array: unsupported state (%zu entries)", n), false;
  bool fortran = s[3]->kind == PK_BOOL ? s[3]->u.b : s[3]->u.i != 0;
  NpArray *a = obj->own;
  if (!np_set(c, a, s[1], s[2], s[4])) return false;
  if (fortran && a->ndim > 1) return cfail(c, "numpy array: Fortran-order arrays are not supported"), false;
  return true;
}

static PkObj *np_call(Ctx *c, GlobalId id, PkObj **a, size_t n) {
  switch (id) {
  case G_NP_RECONSTRUCT: /* _reconstruct(ndarray, (0,), b'b'): an empty array that BUILD fills */
    if (n != 3 || a[0]->kind != PK_GLOBAL || k_globals[a[0]->u.g].id != G_NP_NDARRAY)
      return cfail(c, "numpy _reconstruct: unsupported arguments (only numpy.ndarray)");
    return new_ndarray(c);
  case G_NP_DTYPE: { /* dtype('u1', align, copy) */
    if (n < 1 || n > 3) return cfail(c, "numpy dtype: unsupported arguments");
    PkObj *o = new_obj(c, PK_NPDTYPE);
    charge(c, sizeof(NpDtype));
    o->own = tg_xcalloc(1, sizeof(NpDtype));
    if (!np_dtype_parse(c, a[0], o->own)) return NULL;
    return o;
  }
  case G_NP_FROMBUFFER: { /* _frombuffer(buffer, dtype, shape, order) (protocol 5) */
    if (n != 4 || (a[3]->kind != PK_STR && a[3]->kind != PK_BYTES) || a[3]->u.s.n != 1)
      return cfail(c, "numpy _frombuffer: unsupported arguments");
    PkObj *o = new_ndarray(c);
    if (!np_set(c, o->own, a[2], a[1], a[0])) return NULL;
    if (a[3]->u.s.p[0] != 'C' && ((NpArray *)o->own)->ndim > 1)
      return cfail(c, "numpy array: Fortran-order arrays are not supported");
    return o;
  }
  default:
    return cfail(c, "pickle calls numpy.ndarray directly; only arrays numpy pickled can be loaded");
  }
}

static PkObj *call(Ctx *c, PkObj *fn, PkObj *args, int depth) {
  if (fn->kind != PK_GLOBAL) return cfail(c, "pickle calls a %s, which is not callable", kind_name(fn));
  if (args->kind != PK_TUPLE)
    return cfail(c, "pickle calls %s.%s with arguments that are not a tuple", k_globals[fn->u.g].module,
                 k_globals[fn->u.g].name);
  PkObj **a = args->u.seq.v;
  size_t n = args->u.seq.n;
  switch (k_globals[fn->u.g].id) {
  case G_ORDERED_DICT: {
    PkObj *d = new_obj(c, PK_DICT);
    if (n == 0) return d;
    if (n == 1 && (a[0]->kind == PK_LIST || a[0]->kind == PK_TUPLE)) {
      for (size_t i = 0; i < a[0]->u.seq.n; i++) {
        PkObj *kv = a[0]->u.seq.v[i];
        if ((kv->kind != PK_TUPLE && kv->kind != PK_LIST) || kv->u.seq.n != 2)
          return cfail(c, "OrderedDict: items are not pairs");
        dict_put(c, d, kv->u.seq.v[0], kv->u.seq.v[1]);
      }
      return d;
    }
    return cfail(c, "OrderedDict: unsupported arguments");
  }
  case G_REBUILD_TENSOR_V2:
    return rebuild_tensor(c, a, n);
  case G_REBUILD_PARAMETER:
  case G_REBUILD_PARAMETER_STATE:
    if (n != (k_globals[fn->u.g].id == G_REBUILD_PARAMETER ? 3u : 4u) || a[0]->kind != PK_TENSOR)
      return cfail(c, "%s: unsupported arguments", k_globals[fn->u.g].name);
    return a[0];
  case G_REBUILD_FROM_TYPE_V2: {
    /* (func, new_type, args, state): func(*args), the subclass type and state are dropped */
    if (n != 4 || a[1]->kind != PK_GLOBAL || k_globals[a[1]->u.g].id != G_TENSOR_TYPE ||
        a[2]->kind != PK_TUPLE || depth > 0)
      return cfail(c, "_rebuild_from_type_v2: unsupported arguments");
    PkObj *r = call(c, a[0], a[2], depth + 1);
    if (r && r->kind != PK_TENSOR) return cfail(c, "_rebuild_from_type_v2 did not rebuild a tensor");
    return r;
  }
  case G_CODECS_ENCODE:
    return codecs_encode(c, a, n);
  case G_TORCH_SIZE:
    if (n != 1 || (a[0]->kind != PK_TUPLE && a[0]->kind != PK_LIST)) return cfail(c, "torch.Size: unsupported arguments");
    return a[0];
  case G_TENSOR_TYPE:
  case G_STORAGE_TYPE:
  case G_TORCH_DTYPE:
    break;
  case G_NP_RECONSTRUCT:
  case G_NP_NDARRAY:
  case G_NP_DTYPE:
  case G_NP_FROMBUFFER:
    return np_call(c, k_globals[fn->u.g].id, a, n);
  }
  return cfail(c, "pickle calls '%s.%s', which is not a tensor rebuild function; only tensors can be loaded",
               k_globals[fn->u.g].module, k_globals[fn->u.g].name);
}

static PkObj *resolve_global(Ctx *c, const uint8_t *mod, size_t mlen, const uint8_t *name, size_t nlen) {
  for (size_t i = 0; i < sizeof k_globals / sizeof k_globals[0]; i++) {
    if (k_globals[i].id >= G_NP_RECONSTRUCT && !c->numpy) continue;
    if (strlen(k_globals[i].module) == mlen && memcmp(k_globals[i].module, mod, mlen) == 0 &&
        strlen(k_globals[i].name) == nlen && memcmp(k_globals[i].name, name, nlen) == 0) {
      PkObj *o = new_obj(c, PK_GLOBAL);
      o->u.g = (int)i;
      return o;
    }
  }
  char mb[120], nb[120];
  printable(mb, sizeof mb, mod, mlen);
  printable(nb, sizeof nb, name, nlen);
  if (mlen == 5 && memcmp(mod, "torch", 5) == 0 && nlen > 7 && memcmp(name + nlen - 7, "Storage", 7) == 0)
    return cfail(c, "unsupported storage type 'torch.%s' (no such dtype in tinygrad.c)", nb);
  return cfail(c, "pickle references forbidden global '%s.%s'; only %s can be loaded", mb, nb,
               c->numpy ? "numpy arrays, numbers, strings and containers" : "tensors");
}

/* ---- the pickle machine ---------------------------------------------------------------------- */

typedef struct {
  Ctx *c;
  PkObj **v;
  size_t n, cap;
  size_t *marks;
  size_t nmarks, capmarks;
  /* the memo: picklers number entries 0, 1, 2, ...: those sit in a dense array (8 bytes each);
   * an index far from the others goes to the hash map */
  PkObj **dense;
  size_t ndense, capdense, nmemo;
  Map memo;
} Machine;

static void memo_put(Machine *m, uint64_t idx, PkObj *o) {
  Ctx *c = m->c;
  if (idx < m->ndense) {
    if (!m->dense[idx]) m->nmemo++;
    m->dense[idx] = o;
    return;
  }
  if (idx < (uint64_t)m->nmemo * 2 + 1024) { /* near the others: grow the dense array to it */
    if (idx >= m->capdense) {
      size_t ncap = m->capdense ? m->capdense : 256;
      while (ncap <= idx) ncap *= 2;
      if (!charge(c, (ncap - m->capdense) * sizeof(PkObj *))) return;
      m->dense = tg_xrealloc(m->dense, ncap * sizeof(PkObj *));
      memset(m->dense + m->capdense, 0, (ncap - m->capdense) * sizeof(PkObj *));
      m->capdense = ncap;
    }
    void **old = map_slot(&m->memo, idx + 1, false); /* an entry put far ahead earlier moves here */
    if (old && *old) *old = NULL;
    else m->nmemo++;
    m->dense[idx] = o;
    m->ndense = (size_t)idx + 1;
    return;
  }
  if ((m->memo.n + 1) * 2 > m->memo.cap && /* the map doubles: keys and values */
      !charge(c, (m->memo.cap ? m->memo.cap : 64) * (sizeof(uint64_t) + sizeof(void *))))
    return;
  void **slot = map_slot(&m->memo, idx + 1, true);
  if (!*slot) m->nmemo++;
  *slot = o;
}

static PkObj *memo_get(const Machine *m, uint64_t idx) {
  if (idx < m->ndense && m->dense[idx]) return m->dense[idx];
  void **slot = map_slot((Map *)&m->memo, idx + 1, false);
  return slot ? *slot : NULL;
}

static void push(Machine *m, PkObj *o) {
  if (m->n == m->cap) {
    charge(m->c, (m->cap ? m->cap : 64) * sizeof *m->v);
    m->cap = m->cap ? m->cap * 2 : 64;
    m->v = tg_xrealloc(m->v, m->cap * sizeof *m->v);
  }
  m->v[m->n++] = o;
}
static size_t fence(const Machine *m) { return m->nmarks ? m->marks[m->nmarks - 1] : 0; }

static int64_t le_signed(const uint8_t *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~UINT64_C(0) << (8 * n);
  return (int64_t)v;
}

/* The decimal text of a protocol 0/1 INT or LONG ("-12", "01", "119547037146038801333356L"): an
 * int, a bool (INT's "01" / "00"), or past int64 a PK_BIGINT in LONG1's little-endian two's
 * complement bytes (the legacy format's magic number is one). */
static PkObj *text_int(Ctx *c, const uint8_t *t, size_t n, bool is_long) {
  if (is_long && n && t[n - 1] == 'L') n--;
  if (!is_long && n == 2 && t[0] == '0' && (t[1] == '0' || t[1] == '1')) return const_obj(c, PK_BOOL, t[1] == '1');
  bool neg = n && t[0] == '-';
  size_t d0 = neg || (n && t[0] == '+') ? 1 : 0;
  if (n <= d0 || n - d0 > 4096) return cfail(c, "corrupt pickle: bad integer text of %zu characters", n);
  /* the magnitude in base 256, little-endian */
  size_t cap = (n - d0) / 2 + 2, used = 1;
  if (!charge(c, cap + 1)) return NULL;
  uint8_t *mag = tg_xcalloc(cap + 1, 1);
  for (size_t i = d0; i < n; i++) {
    if (t[i] < '0' || t[i] > '9') {
      free(mag);
      return cfail(c, "corrupt pickle: bad integer text (character 0x%02x)", t[i]);
    }
    unsigned carry = (unsigned)(t[i] - '0');
    for (size_t k = 0; k < used; k++) {
      unsigned v = mag[k] * 10u + carry;
      mag[k] = (uint8_t)v, carry = v >> 8;
    }
    if (carry) mag[used++] = (uint8_t)carry;
  }
  while (used > 1 && !mag[used - 1]) used--;
  /* two's complement: negate a negative magnitude; one more byte where the sign bit would be wrong */
  if (neg) {
    unsigned carry = 1;
    for (size_t k = 0; k < used; k++) {
      unsigned v = (uint8_t)~mag[k] + carry;
      mag[k] = (uint8_t)v, carry = v >> 8;
    }
    if (!(mag[used - 1] & 0x80)) mag[used++] = 0xFF;
    while (used > 1 && mag[used - 1] == 0xFF && (mag[used - 2] & 0x80)) used--;
  } else if (mag[used - 1] & 0x80) {
    mag[used++] = 0;
  }
  PkObj *o;
  if (used <= 8) {
    o = new_obj(c, PK_INT);
    o->u.i = le_signed(mag, used);
    free(mag);
  } else {
    o = new_obj(c, PK_BIGINT);
    o->own = mag;
    o->u.s.p = mag;
    o->u.s.n = used;
  }
  return o;
}

/* Runs one pickle from p[0..len); returns the object at STOP and the bytes consumed. */
static PkObj *unpickle(Ctx *c, const uint8_t *p, size_t len, size_t *consumed) {
  Machine m = {.c = c};
  PkObj *result = NULL;
  size_t pos = 0;
#define NEED(k)                                                                                              \
  do {                                                                                                       \
    if ((uint64_t)(k) > len - pos) {                                                                         \
      cfail(c, "truncated pickle (opcode 0x%02x at offset %zu needs %" PRIu64 " more bytes)", op, pos - 1,   \
            (uint64_t)(k));                                                                                  \
      goto done;                                                                                             \
    }                                                                                                        \
  } while (0)
#define AVAIL(k)                                                                                             \
  do {                                                                                                       \
    if (m.n - fence(&m) < (size_t)(k)) {                                                                     \
      cfail(c, "corrupt pickle: stack underflow at opcode 0x%02x (offset %zu)", op, pos - 1);                \
      goto done;                                                                                             \
    }                                                                                                        \
  } while (0)
#define POP() (m.v[--m.n])
#define CHECK(x)                                                                                             \
  do {                                                                                                       \
    if (!(x)) goto done;                                                                                     \
  } while (0)
  for (;;) {
    if (c->failed) goto done; /* e.g. the memory budget (charge) */
    if (pos >= len) {
      cfail(c, "truncated pickle (no STOP opcode)");
      goto done;
    }
    uint8_t op = p[pos++];
    PkObj *o;
    switch (op) {
    case 0x80: /* PROTO */
      NEED(1);
      if (p[pos] > 5) {
        cfail(c, "unsupported pickle protocol %d", p[pos]);
        goto done;
      }
      pos++;
      break;
    case 0x95: /* FRAME: a length hint */
      NEED(8);
      pos += 8;
      break;
    case '.': /* STOP */
      AVAIL(1);
      result = POP();
      *consumed = pos;
      goto done;
    case '}':
      push(&m, new_obj(c, PK_DICT));
      break;
    case ']':
      push(&m, new_obj(c, PK_LIST));
      break;
    case ')':
      push(&m, new_obj(c, PK_TUPLE));
      break;
    case 0x8f:
      push(&m, new_obj(c, PK_SET));
      break;
    case 'N':
      push(&m, const_obj(c, PK_NONE, false));
      break;
    case 0x88:
    case 0x89:
      push(&m, const_obj(c, PK_BOOL, op == 0x88));
      break;
    case '(': /* MARK */
      if (m.nmarks == m.capmarks) {
        charge(c, (m.capmarks ? m.capmarks : 16) * sizeof *m.marks);
        m.capmarks = m.capmarks ? m.capmarks * 2 : 16;
        m.marks = tg_xrealloc(m.marks, m.capmarks * sizeof *m.marks);
      }
      m.marks[m.nmarks++] = m.n;
      break;
    case 'd':
    case 'l':
    case 't':
    case 0x91: { /* DICT, LIST, TUPLE, FROZENSET from the items above the mark */
      if (!m.nmarks) {
        cfail(c, "corrupt pickle: opcode 0x%02x without MARK (offset %zu)", op, pos - 1);
        goto done;
      }
      size_t mk = m.marks[--m.nmarks], k = m.n - mk;
      if (op == 'd') {
        if (k % 2) {
          cfail(c, "corrupt pickle: odd number of dict items");
          goto done;
        }
        o = new_obj(c, PK_DICT);
        for (size_t i = mk; i < m.n; i += 2) dict_put(c, o, m.v[i], m.v[i + 1]);
      } else {
        o = new_obj(c, op == 'l' ? PK_LIST : op == 't' ? PK_TUPLE : PK_SET);
        charge(c, k * sizeof(PkObj *));
        o->u.seq.cap = k;
        o->u.seq.v = tg_xmalloc((k ? k : 1) * sizeof(PkObj *));
        if (k) memcpy(o->u.seq.v, m.v + mk, k * sizeof(PkObj *));
        o->u.seq.n = k;
      }
      m.n = mk;
      push(&m, o);
      break;
    }
    case 0x85:
    case 0x86:
    case 0x87: { /* TUPLE1..3 */
      size_t k = (size_t)(op - 0x84);
      AVAIL(k);
      o = new_obj(c, PK_TUPLE);
      charge(c, k * sizeof(PkObj *));
      o->u.seq.v = tg_xmalloc(k * sizeof(PkObj *));
      memcpy(o->u.seq.v, m.v + m.n - k, k * sizeof(PkObj *));
      o->u.seq.n = o->u.seq.cap = k;
      m.n -= k;
      push(&m, o);
      break;
    }
    case 's': { /* SETITEM */
      AVAIL(3);
      PkObj *v = POP(), *k = POP(), *d = m.v[m.n - 1];
      if (d->kind != PK_DICT) {
        cfail(c, "corrupt pickle: SETITEM on a %s", kind_name(d));
        goto done;
      }
      dict_put(c, d, k, v);
      break;
    }
    case 'u':
    case 'e':
    case 0x90: { /* SETITEMS, APPENDS, ADDITEMS: items above the mark go into the object below it */
      if (!m.nmarks) {
        cfail(c, "corrupt pickle: opcode 0x%02x without MARK (offset %zu)", op, pos - 1);
        goto done;
      }
      size_t mk = m.marks[--m.nmarks];
      if (mk == 0 || mk <= fence(&m)) {
        cfail(c, "corrupt pickle: stack underflow at opcode 0x%02x (offset %zu)", op, pos - 1);
        goto done;
      }
      PkObj *d = m.v[mk - 1];
      if (op == 'u') {
        if (d->kind != PK_DICT || (m.n - mk) % 2) {
          cfail(c, "corrupt pickle: SETITEMS on a %s", kind_name(d));
          goto done;
        }
        for (size_t i = mk; i < m.n; i += 2) dict_put(c, d, m.v[i], m.v[i + 1]);
      } else {
        if (d->kind != (op == 'e' ? PK_LIST : PK_SET)) {
          cfail(c, "corrupt pickle: %s on a %s", op == 'e' ? "APPENDS" : "ADDITEMS", kind_name(d));
          goto done;
        }
        for (size_t i = mk; i < m.n; i++) seq_push(c, d, m.v[i]);
      }
      m.n = mk;
      break;
    }
    case 'a': { /* APPEND */
      AVAIL(2);
      PkObj *v = POP(), *l = m.v[m.n - 1];
      if (l->kind != PK_LIST) {
        cfail(c, "corrupt pickle: APPEND on a %s", kind_name(l));
        goto done;
      }
      seq_push(c, l, v);
      break;
    }
    case 'J':
    case 'K':
    case 'M': { /* BININT (4 bytes signed), BININT1, BININT2 (unsigned) */
      size_t k = op == 'J' ? 4 : op == 'K' ? 1 : 2;
      NEED(k);
      if (op == 'K') {
        PkObj **slot = &c->small_int[p[pos]];
        if (!*slot) {
          *slot = new_obj(c, PK_INT);
          (*slot)->u.i = p[pos];
        }
        o = *slot;
      } else {
        o = new_obj(c, PK_INT);
        o->u.i = op == 'J' ? le_signed(p + pos, 4) : (int64_t)(p[pos] | (k == 2 ? p[pos + 1] << 8 : 0));
      }
      pos += k;
      push(&m, o);
      break;
    }
    case 'I':
    case 'L': { /* INT, LONG (protocols 0 and 1): decimal text to the end of the line ("I01" True, "I00"
                 * False; a LONG ends in 'L') */
      const uint8_t *nl = memchr(p + pos, '\n', len - pos);
      if (!nl) {
        cfail(c, "truncated pickle (text %s at offset %zu has no end of line)", op == 'I' ? "INT" : "LONG", pos - 1);
        goto done;
      }
      size_t n = (size_t)(nl - (p + pos));
      o = text_int(c, p + pos, n, op == 'L');
      if (!o) goto done;
      pos += n + 1;
      push(&m, o);
      break;
    }
    case 0x8a:
    case 0x8b: { /* LONG1, LONG4: little-endian two's complement */
      size_t hk = op == 0x8a ? 1 : 4;
      NEED(hk);
      uint64_t k = op == 0x8a ? p[pos] : rd_u32le(p + pos);
      if (op == 0x8b && k > INT32_MAX) {
        cfail(c, "corrupt pickle: negative LONG4 length");
        goto done;
      }
      pos += hk;
      NEED(k);
      if (k <= 8) {
        o = new_obj(c, PK_INT);
        o->u.i = le_signed(p + pos, (size_t)k);
      } else {
        o = new_obj(c, PK_BIGINT);
        o->u.s.p = p + pos;
        o->u.s.n = (size_t)k;
      }
      pos += (size_t)k;
      push(&m, o);
      break;
    }
    case 'G': { /* BINFLOAT: big-endian double */
      NEED(8);
      uint64_t bits = 0;
      for (int i = 0; i < 8; i++) bits = (bits << 8) | p[pos + i];
      pos += 8;
      o = new_obj(c, PK_FLOAT);
      memcpy(&o->u.f, &bits, 8);
      push(&m, o);
      break;
    }
    case 0x8c:   /* SHORT_BINUNICODE */
    case 'X':    /* BINUNICODE */
    case 0x8d:   /* BINUNICODE8 */
    case 'U':    /* SHORT_BINSTRING */
    case 'T':    /* BINSTRING */
    case 'C':    /* SHORT_BINBYTES */
    case 'B':    /* BINBYTES */
    case 0x96:   /* BYTEARRAY8 (protocol 5: a writable buffer pickled in band) */
    case 0x8e: { /* BINBYTES8 */
      size_t hk = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
      NEED(hk);
      uint64_t k = hk == 1 ? p[pos] : hk == 4 ? rd_u32le(p + pos) : rd_u64le(p + pos);
      if (op == 'T' && k > INT32_MAX) {
        cfail(c, "corrupt pickle: negative BINSTRING length");
        goto done;
      }
      pos += hk;
      NEED(k);
      o = new_obj(c, (op == 'C' || op == 'B' || op == 0x8e || op == 0x96) ? PK_BYTES : PK_STR);
      o->u.s.p = p + pos;
      o->u.s.n = (size_t)k;
      pos += (size_t)k;
      push(&m, o);
      break;
    }
    case 'q':
    case 'r':
    case 0x94: { /* BINPUT, LONG_BINPUT, MEMOIZE */
      uint64_t idx;
      if (op == 0x94) {
        idx = m.nmemo;
      } else {
        size_t k = op == 'q' ? 1 : 4;
        NEED(k);
        idx = k == 1 ? p[pos] : rd_u32le(p + pos);
        pos += k;
      }
      AVAIL(1);
      memo_put(&m, idx, m.v[m.n - 1]);
      break;
    }
    case 'h':
    case 'j': { /* BINGET, LONG_BINGET */
      size_t k = op == 'h' ? 1 : 4;
      NEED(k);
      uint64_t idx = k == 1 ? p[pos] : rd_u32le(p + pos);
      pos += k;
      PkObj *got = memo_get(&m, idx);
      if (!got) {
        cfail(c, "corrupt pickle: memo entry %" PRIu64 " is not defined (offset %zu)", idx, pos - 1 - k);
        goto done;
      }
      push(&m, got);
      break;
    }
    case 'c': { /* GLOBAL: "module\nname\n" */
      const uint8_t *mod = p + pos, *nl1 = memchr(mod, '\n', len - pos);
      if (!nl1) {
        cfail(c, "truncated pickle (GLOBAL at offset %zu)", pos - 1);
        goto done;
      }
      const uint8_t *name = nl1 + 1, *nl2 = memchr(name, '\n', (size_t)(p + len - name));
      if (!nl2) {
        cfail(c, "truncated pickle (GLOBAL at offset %zu)", pos - 1);
        goto done;
      }
      pos = (size_t)(nl2 + 1 - p);
      CHECK(o = resolve_global(c, mod, (size_t)(nl1 - mod), name, (size_t)(nl2 - name)));
      push(&m, o);
      break;
    }
    case 0x93: { /* STACK_GLOBAL */
      AVAIL(2);
      PkObj *name = POP(), *mod = POP();
      if (name->kind != PK_STR || mod->kind != PK_STR) {
        cfail(c, "corrupt pickle: STACK_GLOBAL operands are not strings");
        goto done;
      }
      CHECK(o = resolve_global(c, mod->u.s.p, mod->u.s.n, name->u.s.p, name->u.s.n));
      push(&m, o);
      break;
    }
    case 'R': { /* REDUCE */
      AVAIL(2);
      PkObj *args = POP(), *fn = POP();
      CHECK(o = call(c, fn, args, 0));
      push(&m, o);
      break;
    }
    case 0x81:   /* NEWOBJ: cls.__new__(cls, *args) */
    case 0x92: { /* NEWOBJ_EX: cls.__new__(cls, *args, **kwargs) */
      AVAIL(op == 0x81 ? 2 : 3);
      if (op == 0x92) (void)POP();
      PkObj *args = POP(), *cls = POP();
      if (cls->kind != PK_GLOBAL || k_globals[cls->u.g].id != G_ORDERED_DICT || args->kind != PK_TUPLE) {
        cfail(c, "pickle instantiates an unsupported class; only tensors can be loaded");
        goto done;
      }
      push(&m, new_obj(c, PK_DICT));
      break;
    }
    case 'b': { /* BUILD: obj.__setstate__(state); the states of dicts and tensors are ignored, numpy's
                 * arrays and dtypes take theirs */
      AVAIL(2);
      PkObj *state = POP(), *obj = m.v[m.n - 1];
      if (obj->kind == PK_NDARRAY || obj->kind == PK_NPDTYPE) {
        CHECK(np_build(c, obj, state));
        break;
      }
      if (obj->kind != PK_DICT && obj->kind != PK_TENSOR) {
        cfail(c, "corrupt pickle: BUILD on a %s", kind_name(obj));
        goto done;
      }
      break;
    }
    case 'Q': { /* BINPERSID */
      AVAIL(1);
      CHECK(o = persistent_load(c, POP()));
      push(&m, o);
      break;
    }
    case '0': /* POP (or a mark with nothing above it) */
      if (m.n > fence(&m))
        m.n--;
      else if (m.nmarks)
        m.nmarks--;
      else {
        cfail(c, "corrupt pickle: stack underflow at POP (offset %zu)", pos - 1);
        goto done;
      }
      break;
    case '1': /* POP_MARK */
      if (!m.nmarks) {
        cfail(c, "corrupt pickle: POP_MARK without MARK");
        goto done;
      }
      m.n = m.marks[--m.nmarks];
      break;
    case '2': /* DUP */
      AVAIL(1);
      push(&m, m.v[m.n - 1]);
      break;
    default:
      if (op && strchr("pgSVFP", op)) /* text opcodes only protocol 0 writes */
        cfail(c, "unsupported pickle opcode 0x%02x ('%c') at offset %zu: a pickle protocol 0 checkpoint, which "
                 "torch.load cannot read either; save with pickle_protocol 1 or later", op, op, pos - 1);
      else
        cfail(c, "unsupported pickle opcode 0x%02x at offset %zu", op, pos - 1);
      goto done;
    }
  }
done:
#undef NEED
#undef AVAIL
#undef POP
#undef CHECK
  free(m.v);
  free(m.marks);
  free(m.dense);
  map_free(&m.memo);
  return c->failed ? NULL : result;
}

/* ---- materializing tensors ------------------------------------------------------------------- */

static const uint8_t *storage_data(const Storage *s) {
  if (s->base) { /* views are one level deep: persistent_load refuses a view of a view */
    const uint8_t *b = s->base->data;
    return b ? b + s->base_off * tg_dtype_itemsize(s->dt) : NULL;
  }
  return s->data;
}

static void fix_element(uint8_t *dst, size_t isz, bool swap, bool is_bool) {
  if (swap)
    for (size_t i = 0; i < isz / 2; i++) {
      uint8_t t = dst[i];
      dst[i] = dst[isz - 1 - i];
      dst[isz - 1 - i] = t;
    }
  if (is_bool) dst[0] = dst[0] != 0; /* a bool byte other than 0/1 would be undefined in kernels */
}

/* Called once per tensor made from s: after the last one, the storage's bytes can go (an inflated
 * member is freed, a file's pages are given back), so the peak stays near the file's size. */
static void storage_used(Storage *s) {
  Storage *root = s->base ? s->base : s;
  if (++root->nused < root->nref || !root->data) return;
  if (root->owned) {
    free(root->owned);
    root->owned = NULL;
  } else {
    sd_release_bytes(root->data, (size_t)root->numel * tg_dtype_itemsize(root->dt));
  }
  root->data = NULL;
}

static tg_tensor materialize_once(Ctx *c, TensorDesc *t);

static tg_tensor materialize(Ctx *c, TensorDesc *t) {
  if (t->handle.id) return t->handle;
  tg_tensor h = materialize_once(c, t);
  if (h.id) storage_used(t->st);
  return h;
}

static tg_tensor materialize_once(Ctx *c, TensorDesc *t) {
  Storage *s = t->st;
  const uint8_t *base = storage_data(s);
  if (!base && s->numel > 0) return cfail(c, "a tensor's storage has no data in the file"), (tg_tensor){0};
  size_t isz = tg_dtype_itemsize(s->dt);
  uint64_t numel = 1;
  for (int i = 0; i < t->ndim; i++) numel *= (uint64_t)t->shape[i]; /* bounded by rebuild_tensor */
  uint64_t nbytes = numel * isz;
  uint64_t budget = 8 * c->storage_bytes + EXPAND_SLACK;
  if (c->materialized_bytes + nbytes > budget)
    return cfail(c, "tensor views expand to more than %" PRIu64 " bytes (8x the file's storages + 64 MiB)",
                 budget),
           (tg_tensor){0};
  c->materialized_bytes += nbytes;
  bool contiguous = true;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != expect) contiguous = false;
    expect *= t->shape[i];
  }
  const tg_opts opts = {.dtype = s->dt};
  if (numel == 0) return t->handle = tg_from_data(NULL, t->shape, t->ndim, &opts);
  const uint8_t *src0 = base + (uint64_t)t->offset * isz;
  if (contiguous && !c->swap && s->dt != TG_BOOL)
    return t->handle = tg_from_data(src0, t->shape, t->ndim, &opts);
  uint8_t *buf = malloc((size_t)nbytes);
  if (!buf) return cfail(c, "out of memory (%" PRIu64 " bytes for one tensor)", nbytes), (tg_tensor){0};
  int nd = t->ndim;
  int64_t idx[MAX_NDIM] = {0};
  int64_t inner = nd ? t->shape[nd - 1] : 1, istride = nd ? t->stride[nd - 1] : 0;
  uint8_t *dst = buf;
  for (uint64_t done = 0; done < numel; done += (uint64_t)inner) {
    int64_t off = t->offset;
    for (int i = 0; i < nd - 1; i++) off += idx[i] * t->stride[i];
    const uint8_t *src = base + (uint64_t)off * isz;
    if (istride == 1) {
      memcpy(dst, src, (size_t)inner * isz);
    } else {
      for (int64_t j = 0; j < inner; j++)
        memcpy(dst + (size_t)j * isz, src + (uint64_t)(j * istride) * isz, isz);
    }
    if (c->swap || s->dt == TG_BOOL)
      for (int64_t j = 0; j < inner; j++) fix_element(dst + (size_t)j * isz, isz, c->swap, s->dt == TG_BOOL);
    dst += (size_t)inner * isz;
    for (int i = nd - 2; i >= 0; i--) { /* odometer over the outer dimensions */
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
  t->handle = tg_from_data(buf, t->shape, t->ndim, &opts);
  free(buf);
  return t->handle;
}

/* ---- flattening into the dict ------------------------------------------------------------------ */

static bool is_container(const PkObj *o) {
  return o->kind == PK_DICT || o->kind == PK_LIST || o->kind == PK_TUPLE || o->kind == PK_SET;
}

/* Whether a tensor is reachable from o. Iterative (a hostile pickle can nest objects arbitrarily
 * deep) and cached per object; a back edge of a cycle counts as "no tensor" (cycles can't be flattened
 * anyway: the depth limit stops them). */
typedef struct {
  PkObj *o;
  size_t i;
  bool found;
} DfsFrame;

static size_t n_children(const PkObj *o) {
  return o->kind == PK_DICT ? o->u.d.n : is_container(o) ? o->u.seq.n : 0;
}
static PkObj *child_at(const PkObj *o, size_t i) { return o->kind == PK_DICT ? o->u.d.v[i] : o->u.seq.v[i]; }

static bool contains_tensor(PkObj *root) {
  if (root->kind == PK_TENSOR) return true;
  if (!is_container(root)) return false;
  if (root->has_tensor >= 2) return root->has_tensor == 3;
  if (root->has_tensor == 1) return false;
  size_t n = 0, cap = 64;
  DfsFrame *st = tg_xmalloc(cap * sizeof *st);
  st[n++] = (DfsFrame){root, 0, false};
  root->has_tensor = 1;
  while (n > 0) {
    DfsFrame *f = &st[n - 1];
    if (f->i < n_children(f->o)) {
      PkObj *ch = child_at(f->o, f->i++);
      if (ch->kind == PK_TENSOR || ch->has_tensor == 3) {
        f->found = true;
      } else if (is_container(ch) && ch->has_tensor == 0) {
        if (n == cap) st = tg_xrealloc(st, (cap *= 2) * sizeof *st);
        ch->has_tensor = 1;
        st[n++] = (DfsFrame){ch, 0, false};
      }
      continue;
    }
    f->o->has_tensor = f->found ? 3 : 2;
    bool found = f->found;
    n--;
    if (n > 0 && found) st[n - 1].found = true;
  }
  free(st);
  return root->has_tensor == 3;
}

/* Python-repr-like text of a tensor-free value, cut at META_VALUE_MAX bytes. Output is valid UTF-8. */
static void put_escaped(SB *b, const uint8_t *s, size_t n, char quote, bool utf8_ok) {
  for (size_t i = 0; i < n && b->len < META_VALUE_MAX; i++) {
    uint8_t ch = s[i];
    if (ch == '\\' || (quote && ch == (uint8_t)quote))
      sb_printf(b, "\\%c", ch);
    else if (ch == '\n')
      sb_puts(b, "\\n");
    else if (ch == '\t')
      sb_puts(b, "\\t");
    else if (ch < 0x20 || ch == 0x7f || (ch >= 0x80 && !utf8_ok))
      sb_printf(b, "\\x%02x", ch);
    else
      sb_putc(b, (char)ch);
  }
}

static void put_float(SB *b, double v) {
  if (isnan(v)) return sb_puts(b, "nan");
  if (isinf(v)) return sb_puts(b, v > 0 ? "inf" : "-inf");
  char tmp[40];
  for (int prec = 1; prec <= 17; prec++) { /* shortest text that reads back exactly, like repr */
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  sb_puts(b, tmp);
  if (!strpbrk(tmp, ".en")) sb_puts(b, ".0");
}

static void render(PkObj *o, SB *b, int depth) {
  if (b->len >= META_VALUE_MAX) return;
  if (depth > MAX_DEPTH) return sb_puts(b, "...");
  switch (o->kind) {
  case PK_NONE:
    sb_puts(b, "None");
    break;
  case PK_BOOL:
    sb_puts(b, o->u.b ? "True" : "False");
    break;
  case PK_INT:
    sb_printf(b, "%" PRId64, o->u.i);
    break;
  case PK_BIGINT: { /* wider than 64 bits (little-endian two's complement): in decimal, as Python */
    size_t n = o->u.s.n;
    if (n == 0 || n > 1024) { /* (a decimal of more than ~2500 digits would be cut anyway) */
      sb_puts(b, n ? "<a very large int>" : "0");
      break;
    }
    uint8_t *mag = tg_xmalloc(n);
    bool neg = o->u.s.p[n - 1] & 0x80;
    int carry = 1;
    for (size_t i = 0; i < n; i++) { /* the magnitude: the bytes, negated if negative */
      int v = neg ? (uint8_t)~o->u.s.p[i] + carry : o->u.s.p[i];
      mag[i] = (uint8_t)v, carry = neg ? v >> 8 : 0;
    }
    char *dig = tg_xmalloc(n * 3 + 2);
    size_t nd = 0, top = n;
    while (top > 0) { /* repeated division by 10, most significant byte first */
      unsigned rem = 0;
      for (size_t i = top; i-- > 0;) {
        unsigned cur = rem * 256 + mag[i];
        mag[i] = (uint8_t)(cur / 10), rem = cur % 10;
      }
      dig[nd++] = (char)('0' + rem);
      while (top > 0 && mag[top - 1] == 0) top--;
    }
    if (!nd) dig[nd++] = '0';
    if (neg) sb_putc(b, '-');
    while (nd > 0 && b->len < META_VALUE_MAX) sb_putc(b, dig[--nd]);
    free(mag), free(dig);
    break;
  }
  case PK_FLOAT:
    put_float(b, o->u.f);
    break;
  case PK_STR:
    sb_putc(b, '\'');
    put_escaped(b, o->u.s.p, o->u.s.n, '\'', utf8_valid(o->u.s.p, o->u.s.n));
    sb_putc(b, '\'');
    break;
  case PK_BYTES:
    sb_puts(b, "b'");
    put_escaped(b, o->u.s.p, o->u.s.n, '\'', false);
    sb_putc(b, '\'');
    break;
  case PK_TUPLE:
  case PK_LIST:
  case PK_SET: {
    const char *open = o->kind == PK_TUPLE  ? "("
                       : o->kind == PK_LIST ? "["
                                            : "{",
               *close = o->kind == PK_TUPLE  ? ")"
                        : o->kind == PK_LIST ? "]"
                                             : "}";
    sb_puts(b, open);
    for (size_t i = 0; i < o->u.seq.n && b->len < META_VALUE_MAX; i++) {
      if (i) sb_puts(b, ", ");
      render(o->u.seq.v[i], b, depth + 1);
    }
    if (o->kind == PK_TUPLE && o->u.seq.n == 1) sb_putc(b, ',');
    sb_puts(b, close);
    break;
  }
  case PK_DICT:
    sb_putc(b, '{');
    for (size_t i = 0; i < o->u.d.n && b->len < META_VALUE_MAX; i++) {
      if (i) sb_puts(b, ", ");
      render(o->u.d.k[i], b, depth + 1);
      sb_puts(b, ": ");
      render(o->u.d.v[i], b, depth + 1);
    }
    sb_putc(b, '}');
    break;
  case PK_GLOBAL:
    if (k_globals[o->u.g].id == G_TORCH_DTYPE) sb_printf(b, "torch.%s", k_globals[o->u.g].name); /* (Python's repr) */
    else sb_printf(b, "<%s.%s>", k_globals[o->u.g].module, k_globals[o->u.g].name);
    break;
  case PK_STORAGE:
    sb_printf(b, "<%s storage of %" PRIu64 ">", tg_dtype_name(o->u.st->dt), o->u.st->numel);
    break;
  case PK_TENSOR:
    sb_puts(b, "<tensor>");
    break;
  }
}

static bool add_meta(Ctx *c, const char *key, size_t klen, PkObj *v) {
  if (klen == 0 || c->meta_bytes >= META_TOTAL_MAX) return true; /* metadata is best-effort beyond the caps */
  SB b;
  sb_init(&b);
  if (v->kind == PK_STR && utf8_valid(v->u.s.p, v->u.s.n) && !memchr(v->u.s.p, 0, v->u.s.n) &&
      v->u.s.n <= META_VALUE_MAX) {
    sb_printf(&b, "%.*s", (int)v->u.s.n, (const char *)v->u.s.p); /* a plain string stays plain */
  } else {
    render(v, &b, 0);
    if (b.len >= META_VALUE_MAX) {
      b.len = META_VALUE_MAX - 3;
      while (b.len > 0 && (b.s[b.len] & 0xC0) == 0x80) b.len--; /* don't cut a UTF-8 sequence */
      b.s[b.len] = 0;
      sb_puts(&b, "...");
    }
  }
  c->meta_bytes += klen + b.len;
  tg_status st = sd_meta_put(c->sd, c->fn, c->path, key, klen, b.s ? b.s : "", b.len, false);
  sb_free(&b);
  return st == TG_OK;
}

static bool put_tensor(Ctx *c, PkObj *o, const char *name, size_t nlen) {
  if (!utf8_valid((const uint8_t *)name, nlen)) return cfail(c, "tensor name is not valid UTF-8"), false;
  if (++c->n_entries > 16 * c->n_tensors + 1024)
    return cfail(c, "the object names its %zu tensors more than %zu times", c->n_tensors,
                 16 * c->n_tensors + 1024),
           false;
  tg_tensor h = materialize(c, o->u.t);
  if (!h.id) return false;
  tg_tensor d = tg_detach(h);
  if (!d.id) return false;
  return sd_put(c->sd, c->fn, c->path, name, nlen, d, true) == TG_OK;
}

/* Appends ".key" (or "key" at the top) to name; false with an error if the key can't name anything. */
static bool key_text(Ctx *c, PkObj *k, char *name, size_t *nlen) {
  char tmp[64];
  const char *s;
  size_t n;
  switch (k->kind) {
  case PK_STR:
    s = (const char *)k->u.s.p;
    n = k->u.s.n;
    break;
  case PK_INT:
    n = (size_t)snprintf(tmp, sizeof tmp, "%" PRId64, k->u.i);
    s = tmp;
    break;
  case PK_BOOL:
    s = k->u.b ? "True" : "False";
    n = strlen(s);
    break;
  case PK_NONE:
    s = "None";
    n = 4;
    break;
  case PK_TUPLE: { /* its repr, "(1, 2)" */
    SB b;
    sb_init(&b);
    render(k, &b, 0);
    bool ok = b.len < sizeof tmp;
    if (ok) memcpy(tmp, b.s, b.len + 1);
    n = b.len;
    sb_free(&b);
    if (!ok) return cfail(c, "a dict with tensors has a tuple key longer than %zu characters", sizeof tmp - 1), false;
    s = tmp;
    break;
  }
  default:
    return cfail(c, "a dict with tensors has a %s key", kind_name(k)), false;
  }
  if (memchr(s, 0, n)) return cfail(c, "a dict key contains a NUL byte"), false;
  size_t extra = (*nlen ? 1 : 0) + n;
  if (*nlen + extra > MAX_NAME) return cfail(c, "a tensor name is longer than %d bytes", MAX_NAME), false;
  if (*nlen) name[(*nlen)++] = '.';
  memcpy(name + *nlen, s, n);
  *nlen += n;
  name[*nlen] = 0;
  return true;
}

static bool flatten(Ctx *c, PkObj *o, char *name, size_t nlen, int depth);

static bool flatten_child(Ctx *c, PkObj *k, PkObj *v, char *name, size_t nlen, int depth) {
  size_t n2 = nlen;
  if (contains_tensor(v)) {
    if (!key_text(c, k, name, &n2)) return false;
    bool ok = flatten(c, v, name, n2, depth + 1);
    name[nlen] = 0;
    return ok;
  }
  /* tensor-free values become metadata; keys that can't be text are skipped */
  if (k->kind != PK_STR && k->kind != PK_INT && k->kind != PK_BOOL && k->kind != PK_NONE) return true;
  if (k->kind == PK_STR && (memchr(k->u.s.p, 0, k->u.s.n) || !utf8_valid(k->u.s.p, k->u.s.n))) return true;
  if (nlen + 1 + (k->kind == PK_STR ? k->u.s.n : 24) > MAX_NAME) return true;
  if (!key_text(c, k, name, &n2)) return false;
  bool ok = add_meta(c, name, n2, v);
  name[nlen] = 0;
  return ok;
}

static bool flatten(Ctx *c, PkObj *o, char *name, size_t nlen, int depth) {
  if (depth > MAX_DEPTH)
    return cfail(c, "objects are nested more than %d levels deep (or form a cycle)", MAX_DEPTH), false;
  if (++c->visits > MAX_VISITS)
    return cfail(c, "the object graph is too large (more than %u visits)", MAX_VISITS), false;
  switch (o->kind) {
  case PK_TENSOR:
    return put_tensor(c, o, nlen ? name : "tensor", nlen ? nlen : 6);
  case PK_DICT:
    for (size_t i = 0; i < o->u.d.n; i++)
      if (!flatten_child(c, o->u.d.k[i], o->u.d.v[i], name, nlen, depth)) return false;
    return true;
  case PK_LIST:
  case PK_TUPLE:
  case PK_SET:
    for (size_t i = 0; i < o->u.seq.n; i++) {
      PkObj key = {.kind = PK_INT, .u.i = (int64_t)i};
      if (!flatten_child(c, &key, o->u.seq.v[i], name, nlen, depth)) return false;
    }
    return true;
  default:
    return true; /* a bare non-tensor object: an empty dict */
  }
}

/* ---- the two file formats ---------------------------------------------------------------------- */

static PkObj *load_zip(Ctx *c) {
  char zerr[300];
  if (zip_open(&c->zip, c->file, c->file_len, zerr, sizeof zerr) != 0) return cfail(c, "%s", zerr);
  c->have_zip = true;
  if (c->zip.n == 0) return cfail(c, "the zip archive is empty");
  /* the archive directory is the first member's (torch names it after the file) */
  const char *first = c->zip.entries[0].name, *slash = strchr(first, '/');
  if (!slash || (size_t)(slash - first) >= sizeof c->prefix - 16)
    return cfail(c, "not a PyTorch checkpoint (first zip member '%.200s' is not in a directory)", first);
  memcpy(c->prefix, first, (size_t)(slash - first));
  c->prefix[slash - first] = 0;
  char nm[300];
  snprintf(nm, sizeof nm, "%s/data.pkl", c->prefix);
  const ZipEntry *e = zip_find(&c->zip, nm);
  if (!e) return cfail(c, "not a PyTorch checkpoint (no %s in the zip archive)", nm);
  snprintf(nm, sizeof nm, "%s/byteorder", c->prefix);
  const ZipEntry *bo = zip_find(&c->zip, nm);
  if (bo) {
    const uint8_t *p;
    size_t n;
    void *own;
    if (zip_read(&c->zip, bo, 16, &p, &n, &own, zerr, sizeof zerr) != 0) return cfail(c, "%s", zerr);
    bool little = n == 6 && memcmp(p, "little", 6) == 0, big = n == 3 && memcmp(p, "big", 3) == 0;
    free(own);
    if (!little && !big) return cfail(c, "unknown byteorder record");
    c->swap = big; /* this library runs on little-endian hosts */
  }
  const uint8_t *pkl;
  size_t pn;
  void *own;
  if (zip_read(&c->zip, e, UINT64_MAX, &pkl, &pn, &own, zerr, sizeof zerr) != 0) return cfail(c, "%s", zerr);
  size_t used;
  c->mem_budget = MEM_FACTOR * (uint64_t)(pn < c->file_len ? pn : c->file_len) + MEM_SLACK;
  PkObj *root = unpickle(c, pkl, pn, &used);
  /* objects may point into the pickle's bytes: a deflated data.pkl stays alive as an object's own */
  if (own) new_obj(c, PK_NONE)->own = own;
  return root;
}

static const uint8_t k_legacy_magic[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

static PkObj *load_legacy(Ctx *c) {
  c->legacy = true;
  const uint8_t *p = c->file;
  size_t len = c->file_len, pos = 0, used;
  c->mem_budget = MEM_FACTOR * (uint64_t)len + MEM_SLACK; /* the pickles are most of the file */
  PkObj *magic = unpickle(c, p, len, &used);
  if (!magic) return NULL;
  if (magic->kind != PK_BIGINT || magic->u.s.n != 10 || memcmp(magic->u.s.p, k_legacy_magic, 10) != 0)
    return cfail(c, "not a PyTorch checkpoint (wrong magic number)");
  pos += used;
  PkObj *proto = unpickle(c, p + pos, len - pos, &used);
  if (!proto) return NULL;
  if (proto->kind != PK_INT || proto->u.i != 1001) return cfail(c, "unsupported legacy protocol version");
  pos += used;
  PkObj *info = unpickle(c, p + pos, len - pos, &used);
  if (!info) return NULL;
  pos += used;
  if (info->kind == PK_DICT)
    for (size_t i = 0; i < info->u.d.n; i++)
      if (is_str(info->u.d.k[i], "little_endian") && info->u.d.v[i]->kind == PK_BOOL && !info->u.d.v[i]->u.b)
        return cfail(c, "big-endian legacy checkpoints are not supported");
  PkObj *root = unpickle(c, p + pos, len - pos, &used);
  if (!root) return NULL;
  pos += used;
  PkObj *keys = unpickle(c, p + pos, len - pos, &used);
  if (!keys) return NULL;
  pos += used;
  if (keys->kind != PK_LIST)
    return cfail(c, "corrupt legacy checkpoint: the storage key list is a %s", kind_name(keys));
  char kb[200];
  for (size_t i = 0; i < keys->u.seq.n; i++) {
    PkObj *k = keys->u.seq.v[i];
    if (k->kind != PK_STR) return cfail(c, "corrupt legacy checkpoint: a storage key is a %s", kind_name(k));
    printable(kb, sizeof kb, k->u.s.p, k->u.s.n);
    Storage *s = storage_find(c, k->u.s.p, k->u.s.n);
    if (!s || s->base) return cfail(c, "storage '%s' is listed but no tensor uses it", kb);
    if (s->data) return cfail(c, "storage '%s' is listed twice", kb);
    if (len - pos < 8) return cfail(c, "truncated file (storage '%s' is missing)", kb);
    uint64_t count = rd_u64le(p + pos);
    pos += 8;
    if (count != s->numel)
      return cfail(c, "storage '%s' has %" PRIu64 " elements in the file but %" PRIu64 " in the pickle", kb,
                   count, s->numel);
    uint64_t nbytes = count * tg_dtype_itemsize(s->dt);
    if (nbytes > len - pos)
      return cfail(c, "truncated file (storage '%s' needs %" PRIu64 " bytes, %zu remain)", kb, nbytes,
                   len - pos);
    s->data = p + pos;
    pos += (size_t)nbytes;
  }
  for (size_t i = 0; i < c->nst; i++) {
    Storage *s = c->sts[i];
    if (!s->base && !s->data)
      return cfail(c, "storage '%s' has no data in the file", printable(kb, sizeof kb, s->key, s->keylen));
  }
  return root;
}

/* Records the context's failure as the TG_ERR_IO error "fn: path: message". */
static void ctx_error(Ctx *c) {
  if (c->failed) {
    /* names from the file may be anything: keep the message printable and valid UTF-8 */
    bool ok = utf8_valid((const uint8_t *)c->err, strlen(c->err));
    for (char *q = c->err; *q; q++)
      if ((unsigned char)*q < 0x20 || *q == 0x7f || (!ok && (unsigned char)*q >= 0x80)) *q = '?';
    tg_set_error(TG_ERR_IO, "%s: %s: %s", c->fn, c->path, c->err);
  } else
    tg_set_error(TG_ERR_IO, "%s: %s: failed to load", c->fn, c->path); /* an error of a called function is first */
}

static void ctx_free(Ctx *c) {
  for (size_t i = 0; i < c->nobjs; i++) free_obj(obj_at(c, i));
  for (size_t i = 0; i < c->nchunks; i++) free(c->chunks[i]);
  free(c->chunks);
  for (size_t i = 0; i < c->nst; i++) {
    free(c->sts[i]->owned);
    free(c->sts[i]);
  }
  free(c->sts);
  map_free(&c->st_by_key);
  if (c->have_zip) zip_close(&c->zip);
}

tg_state_dict *torch_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len) {
  Ctx c = {.fn = fn, .path = path, .file = data, .file_len = len};
  static const char anchor = 0; /* per-process hash seed: key collisions can't be crafted */
  c.key_seed = 0x70726e ^ (uint64_t)(uintptr_t)&anchor;
  tg_state_dict *sd = NULL;
  PkObj *root = NULL;
  if (len >= 4 && memcmp(data, "PK\x03\x04", 4) == 0) {
    root = load_zip(&c);
  } else if (len >= 2 && (data[0] == 0x80 || data[0] == 'L')) {
    /* (protocol 2 and up begin with PROTO; 0 and 1 with the magic number as a text LONG) */
    root = load_legacy(&c);
  } else if (len >= 262 && memcmp(data + 257, "ustar", 5) == 0) {
    cfail(&c, "tar-format checkpoints (PyTorch before 0.4) are not supported");
  } else {
    cfail(&c, "not a PyTorch checkpoint (neither a zip archive nor a pickle)");
  }
  if (root) {
    c.sd = tg_state_dict_new();
    char *name = tg_xmalloc(MAX_NAME + 1);
    name[0] = 0;
    if (!flatten(&c, root, name, 0, 0)) {
      tg_state_dict_free(c.sd);
      c.sd = NULL;
    }
    free(name);
    sd = c.sd;
  }
  if (!sd) ctx_error(&c);
  ctx_free(&c);
  return sd;
}

bool pickle_fields_mem(const char *fn, const char *path, const uint8_t *data, size_t len, PickleField *f, int nf) {
  Ctx c = {.fn = fn, .path = path, .file = data, .file_len = len, .numpy = true};
  c.mem_budget = MEM_FACTOR * (uint64_t)len + MEM_SLACK;
  for (int i = 0; i < nf; i++) f[i].data = NULL, f[i].ints = NULL, f[i].nbytes = f[i].nints = 0, f[i].ndim = 0;
  size_t used = 0;
  PkObj *root = len && data[0] == 0x80 ? unpickle(&c, data, len, &used)
                                        : cfail(&c, "not a pickle (protocol 2 or later: no PROTO opcode at the start)");
  if (root && used != len) cfail(&c, "%zu bytes follow the pickle", len - used);
  if (root && !c.failed && root->kind != PK_DICT) cfail(&c, "the pickle holds a %s, not a dict", kind_name(root));
  for (int i = 0; i < nf && root && !c.failed; i++) {
    PkObj *v = NULL;
    size_t kl = strlen(f[i].key);
    for (size_t j = 0; j < root->u.d.n && !v; j++) {
      PkObj *k = root->u.d.k[j];
      if ((k->kind == PK_STR || k->kind == PK_BYTES) && k->u.s.n == kl && memcmp(k->u.s.p, f[i].key, kl) == 0)
        v = root->u.d.v[j];
    }
    if (!v) {
      cfail(&c, "the dict has no key '%s'", f[i].key);
      break;
    }
    if (f[i].want_array) {
      NpArray *a = v->kind == PK_NDARRAY ? v->own : NULL;
      if (!a || !a->set) {
        cfail(&c, "'%s' is a %s, not a numpy array", f[i].key, kind_name(v));
        break;
      }
      memcpy(f[i].dtype, a->dt.str, sizeof f[i].dtype);
      f[i].ndim = a->ndim;
      memcpy(f[i].shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
      f[i].nbytes = (size_t)a->nbytes;
      f[i].data = tg_xmalloc(a->nbytes ? (size_t)a->nbytes : 1);
      if (a->nbytes) memcpy(f[i].data, a->data, (size_t)a->nbytes);
    } else {
      if (v->kind != PK_LIST && v->kind != PK_TUPLE) {
        cfail(&c, "'%s' is a %s, not a list of ints", f[i].key, kind_name(v));
        break;
      }
      f[i].nints = v->u.seq.n;
      f[i].ints = tg_xmalloc((f[i].nints ? f[i].nints : 1) * sizeof(int64_t));
      for (size_t j = 0; j < f[i].nints; j++) {
        PkObj *e = v->u.seq.v[j];
        if (e->kind != PK_INT) {
          cfail(&c, "'%s'[%zu] is a %s, not an int", f[i].key, j, kind_name(e));
          break;
        }
        f[i].ints[j] = e->u.i;
      }
    }
  }
  bool ok = root && !c.failed;
  if (!ok) {
    ctx_error(&c);
    pickle_fields_free(f, nf);
  }
  ctx_free(&c);
  return ok;
}

void pickle_fields_free(PickleField *f, int nf) {
  for (int i = 0; i < nf; i++) {
    free(f[i].data);
    free(f[i].ints);
    f[i].data = NULL, f[i].ints = NULL;
  }
}

tg_state_dict *tg_torch_load(const char *path) {
  if (!path) return tg_set_error(TG_ERR_INVALID, FN ": path is NULL"), NULL;
  FileView fv;
  if (file_view_open(&fv, FN, path, false) != TG_OK) return NULL;
  tg_state_dict *sd = torch_load_mem(FN, path, fv.data, fv.len);
  file_view_close(&fv);
  return sd;
}
