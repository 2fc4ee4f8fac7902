/*
 * onnx.c -- ONNX models (a protobuf ModelProto) -> a runnable graph of tensor ops (tinygrad's
 * nn.onnx OnnxRunner).
 *
 * In: untrusted bytes. The decoder reads only the fields the runner needs (ModelProto.graph and
 * opset_import; GraphProto node/initializer/input/output; NodeProto; AttributeProto; TensorProto;
 * ValueInfoProto down to the tensor type and its dims) and skips the rest by wire type. Every read is
 * bounds-checked against the enclosing message; varints are at most 10 bytes; group wire types,
 * lengths past the end, fields of the wrong wire type and nesting deeper than ONNX_MAX_DEPTH are
 * errors. Repeated fields grow one element per element read, so memory is bounded by the file.
 *
 * Out: a tg_onnx holding the initializers and Constant nodes as realized tensors (created once, on
 * the model's device, owned by the model), the nodes in a topological order with each op resolved
 * to a table row, and the graph's inputs/outputs. Load-time errors are TG_ERR_IO
 * "tg_onnx_load: path: what (hint)"; an unsupported op, an undefined name, a name defined twice and a
 * cycle are found at load, before anything runs.
 *
 * Running builds lazy tensors with the public API (broadcasting as numpy). Small integer tensors that
 * describe shapes (Shape -> Gather -> Concat -> Reshape chains, constant axes, pads) are also kept
 * on the host: ops whose inputs are all known on the host are folded there, so shape arithmetic
 * neither runs kernels nor reads tensor data (which keeps a model jittable). A shape argument that is
 * not known on the host is read from its tensor (tg_data), which cannot happen inside a jit capture.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../helpers.h"
#include "loaders.h"
#include "state_dict.h"

#define ONNX_MAX_DEPTH 32  /* message nesting (ModelProto -> ... -> TensorShapeProto.Dimension is 7) */
#define ONNX_MAX_DIMS 32   /* tensor rank */
#define ONNX_HOST_MAX 4096 /* integer tensors up to this many elements are also kept on the host */
#define ONNX_GATHER_SHRINK 16
#define ONNX_HOST_REALS 64 /* float constants up to this many elements also keep their values on the host */
#define ONNX_MAX_WINDOW                                                                                      \
  ((int64_t)1 << 31) /* kernel sizes, strides, dilations, pads */ /* Gather with at most this many constant  \
                                                                     indices uses shrink + cat */

/* ==== protobuf reader ========================================================================== */

typedef struct {
  const uint8_t *start, *end;
  const char *fn, *path;
  int depth;
} PB;
typedef struct {
  const uint8_t *p, *end;
} Cur;

static bool pb_fail(PB *pb, const uint8_t *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool pb_fail(PB *pb, const uint8_t *at, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (at)
    tg_set_error(TG_ERR_IO, "%s: %s: %s (at byte %zu)", pb->fn, pb->path, msg, (size_t)(at - pb->start));
  else
    tg_set_error(TG_ERR_IO, "%s: %s: %s", pb->fn, pb->path, msg);
  return false;
}

static bool rd_varint(PB *pb, Cur *c, uint64_t *out, const char *field) {
  uint64_t v = 0;
  const uint8_t *at = c->p;
  for (int i = 0; i < 10; i++) {
    if (c->p >= c->end)
      return pb_fail(pb, at, "%s: varint runs past the end of its message (truncated or corrupt file?)",
                     field);
    uint8_t b = *c->p++;
    if (i == 9 && b > 1) return pb_fail(pb, at, "%s: varint overflows 64 bits (corrupt file?)", field);
    v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return pb_fail(pb, at, "%s: varint longer than 10 bytes (corrupt file?)", field);
}

/* wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 (3/4, groups, are refused) */
static bool rd_tag(PB *pb, Cur *c, uint32_t *fid, int *wt, const char *msgname) {
  const uint8_t *at = c->p;
  uint64_t v;
  if (!rd_varint(pb, c, &v, msgname)) return false;
  *wt = (int)(v & 7);
  uint64_t f = v >> 3;
  if (f == 0 || f > 0x1fffffff)
    return pb_fail(pb, at, "%s: invalid field number %llu (not a protobuf ONNX file?)", msgname,
                   (unsigned long long)f);
  if (*wt != 0 && *wt != 1 && *wt != 2 && *wt != 5)
    return pb_fail(pb, at,
                   "%s: field %llu has wire type %d, which ONNX never uses (not a protobuf ONNX file?)",
                   msgname, (unsigned long long)f, *wt);
  *fid = (uint32_t)f;
  return true;
}

static bool rd_sub(PB *pb, Cur *c, Cur *sub, const char *field) {
  const uint8_t *at = c->p;
  uint64_t n;
  if (!rd_varint(pb, c, &n, field)) return false;
  if (n > (uint64_t)(c->end - c->p))
    return pb_fail(pb, at,
                   "%s: length %llu runs past the end of its message (%zu bytes left; truncated file?)",
                   field, (unsigned long long)n, (size_t)(c->end - c->p));
  sub->p = c->p;
  sub->end = c->p + n;
  c->p += n;
  return true;
}

static bool want(PB *pb, Cur *c, int wt, int expect, const char *field) {
  static const char *names[] = {"varint", "fixed64", "length-delimited", "group", "group", "fixed32"};
  if (wt == expect) return true;
  return pb_fail(pb, c->p, "%s: wire type %s where %s was expected (corrupt or not an ONNX file?)", field,
                 names[wt], names[expect]);
}

static bool skip_field(PB *pb, Cur *c, int wt, const char *msgname) {
  uint64_t v;
  Cur sub;
  switch (wt) {
  case 0:
    return rd_varint(pb, c, &v, msgname);
  case 2:
    return rd_sub(pb, c, &sub, msgname);
  case 1:
  case 5: {
    size_t n = wt == 1 ? 8 : 4;
    if ((size_t)(c->end - c->p) < n)
      return pb_fail(pb, c->p, "%s: fixed-size field runs past the end of its message", msgname);
    c->p += n;
    return true;
  }
  }
  return pb_fail(pb, c->p, "%s: unknown wire type %d", msgname, wt);
}

static bool enter(PB *pb, Cur *c, const char *field) {
  if (++pb->depth > ONNX_MAX_DEPTH)
    return pb_fail(pb, c->p, "%s: messages nested deeper than %d (corrupt or hostile file?)", field,
                   ONNX_MAX_DEPTH);
  return true;
}

static bool rd_i64(PB *pb, Cur *c, int wt, int64_t *out, const char *field) {
  uint64_t v;
  if (!want(pb, c, wt, 0, field) || !rd_varint(pb, c, &v, field)) return false;
  *out = (int64_t)v;
  return true;
}

/* A string field, copied and NUL-terminated. Names may not contain NUL bytes. */
static bool rd_str(PB *pb, Cur *c, int wt, char **out, const char *field) {
  Cur s;
  if (!want(pb, c, wt, 2, field) || !rd_sub(pb, c, &s, field)) return false;
  size_t n = (size_t)(s.end - s.p);
  if (memchr(s.p, 0, n)) return pb_fail(pb, s.p, "%s: string contains a NUL byte", field);
  char *str = malloc(n + 1);
  if (!str) return pb_fail(pb, s.p, "%s: out of memory", field);
  memcpy(str, s.p, n);
  str[n] = 0;
  free(*out);
  *out = str;
  return true;
}

/* ---- growable arrays (each element read consumes at least one byte of the file) ---- */
typedef struct {
  int64_t *v;
  size_t n, cap;
} I64s;
typedef struct {
  double *v;
  size_t n, cap;
} F64s;

static bool grow(void **p, size_t *cap, size_t n, size_t elsize) {
  if (n < *cap) return true;
  size_t nc = *cap ? *cap * 2 : 8;
  void *q = realloc(*p, nc * elsize);
  if (!q) return false;
  *p = q;
  *cap = nc;
  return true;
}
static bool i64_push(I64s *a, int64_t v) {
  if (!grow((void **)&a->v, &a->cap, a->n, sizeof *a->v)) return false;
  a->v[a->n++] = v;
  return true;
}
static bool f64_push(F64s *a, double v) {
  if (!grow((void **)&a->v, &a->cap, a->n, sizeof *a->v)) return false;
  a->v[a->n++] = v;
  return true;
}

/* repeated int64/int32/uint64 (varints), packed or not */
static bool rd_ints(PB *pb, Cur *c, int wt, I64s *a, const char *field) {
  uint64_t v;
  if (wt == 0) {
    if (!rd_varint(pb, c, &v, field)) return false;
    return i64_push(a, (int64_t)v) || pb_fail(pb, c->p, "%s: out of memory", field);
  }
  Cur s;
  if (!want(pb, c, wt, 2, field) || !rd_sub(pb, c, &s, field)) return false;
  while (s.p < s.end) {
    if (!rd_varint(pb, &s, &v, field)) return false;
    if (!i64_push(a, (int64_t)v)) return pb_fail(pb, s.p, "%s: out of memory", field);
  }
  return true;
}

/* repeated float (fixed32) or double (fixed64), packed or not */
static bool rd_reals(PB *pb, Cur *c, int wt, F64s *a, bool dbl, const char *field) {
  size_t w = dbl ? 8 : 4;
  Cur s;
  if (wt == (dbl ? 1 : 5)) {
    if ((size_t)(c->end - c->p) < w)
      return pb_fail(pb, c->p, "%s: value runs past the end of its message", field);
    s.p = c->p;
    s.end = c->p + w;
    c->p += w;
  } else {
    if (!want(pb, c, wt, 2, field) || !rd_sub(pb, c, &s, field)) return false;
    if ((size_t)(s.end - s.p) % w)
      return pb_fail(pb, s.p, "%s: packed length %zu is not a multiple of %zu", field, (size_t)(s.end - s.p),
                     w);
  }
  for (; s.p < s.end; s.p += w) {
    double d;
    if (dbl) {
      memcpy(&d, s.p, 8);
    } else {
      float f;
      memcpy(&f, s.p, 4);
      d = f;
    }
    if (!f64_push(a, d)) return pb_fail(pb, s.p, "%s: out of memory", field);
  }
  return true;
}

/* ==== parsed model ============================================================================ */

/* An integer (or bool) tensor known on the host: values as int64. */
typedef struct {
  tg_dtype dt;
  int ndim;
  int64_t shape[ONNX_MAX_DIMS];
  int64_t n;
  int64_t *v;
} HostVal;

static void host_free(HostVal *h) {
  if (h) free(h->v);
  free(h);
}
static HostVal *host_new(tg_dtype dt, const int64_t *shape, int ndim) {
  HostVal *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->dt = dt;
  h->ndim = ndim;
  h->n = 1;
  for (int i = 0; i < ndim; i++) {
    h->shape[i] = shape[i];
    h->n *= shape[i];
  }
  h->v = calloc((size_t)(h->n ? h->n : 1), sizeof *h->v);
  if (!h->v) {
    free(h);
    return NULL;
  }
  return h;
}

typedef struct {
  tg_tensor t;     /* persisted, owned by the model */
  HostVal *h;      /* integer/bool tensors of at most ONNX_HOST_MAX elements */
  bool has_scalar; /* one element: its value */
  double scalar;
  double *fv; /* float tensors of at most ONNX_HOST_REALS elements (Resize's scales): values */
  int64_t nfv;
  tg_dtype dt;
} Const;

enum {
  AT_UNDEF = 0,
  AT_FLOAT = 1,
  AT_INT,
  AT_STRING,
  AT_TENSOR,
  AT_GRAPH,
  AT_FLOATS,
  AT_INTS,
  AT_STRINGS,
  AT_OTHER
};
typedef struct {
  char *name;
  int type;
  double f;
  int64_t i;
  char *s;
  I64s ints;
  F64s floats;
  int t; /* index into consts, or -1 */
  bool has_f, has_i, has_s, has_t, has_g;
} Attr;

struct OpDef;
typedef struct {
  char *name, *op, *domain;
  int nin, nout;
  int *in, *out; /* value ids; -1 for an omitted optional ("") */
  Attr *at;
  int nat;
  const struct OpDef *def;
} Node;

typedef struct {
  char *name;
  tg_dtype dt; /* TG_DTYPE_DEFAULT when the file does not say */
  int ndim;    /* -1: unknown rank */
  int64_t shape[ONNX_MAX_DIMS];
  char *dimparam[ONNX_MAX_DIMS];
  bool not_tensor;
  int val;
} VInfo;

enum { V_UNDEF = 0, V_INPUT, V_CONST, V_NODE };
typedef struct {
  char *name;
  int kind, ref;
} Value;

struct tg_onnx {
  char *path;
  char *device;
  int64_t opset;
  Value *vals;
  int nvals, capvals;
  int *hash; /* open addressing over vals, -1 empty */
  int hcap;
  Const *consts;
  int nconsts, capconsts;
  VInfo *inputs, *outputs;
  int ninputs, noutputs, capin, capout;
  Node *nodes;
  int nnodes, capnodes;
  int *order; /* topological order of the nodes that run (Constant nodes are folded at load) */
  int nnodes_run;
};

static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static int val_find(const tg_onnx *m, const char *name) {
  if (!m->hcap) return -1;
  for (uint64_t i = str_hash(name) & (uint64_t)(m->hcap - 1);; i = (i + 1) & (uint64_t)(m->hcap - 1)) {
    int id = m->hash[i];
    if (id < 0) return -1;
    if (!strcmp(m->vals[id].name, name)) return id;
  }
}

/* The id of `name`, adding it (undefined) when new; -1 on allocation failure. */
static int val_get(tg_onnx *m, const char *name) {
  int id = val_find(m, name);
  if (id >= 0) return id;
  if ((m->nvals + 1) * 2 > m->hcap) {
    int nc = m->hcap ? m->hcap * 2 : 64;
    int *nh = malloc((size_t)nc * sizeof *nh);
    if (!nh) return -1;
    for (int i = 0; i < nc; i++) nh[i] = -1;
    for (int k = 0; k < m->nvals; k++) {
      uint64_t i = str_hash(m->vals[k].name) & (uint64_t)(nc - 1);
      while (nh[i] >= 0) i = (i + 1) & (uint64_t)(nc - 1);
      nh[i] = k;
    }
    free(m->hash);
    m->hash = nh;
    m->hcap = nc;
  }
  size_t cap = (size_t)m->capvals;
  if (!grow((void **)&m->vals, &cap, (size_t)m->nvals, sizeof *m->vals)) return -1;
  m->capvals = (int)cap;
  char *copy = strdup(name);
  if (!copy) return -1;
  id = m->nvals++;
  m->vals[id] = (Value){.name = copy, .kind = V_UNDEF, .ref = -1};
  uint64_t i = str_hash(name) & (uint64_t)(m->hcap - 1);
  while (m->hash[i] >= 0) i = (i + 1) & (uint64_t)(m->hcap - 1);
  m->hash[i] = id;
  return id;
}

/* ==== TensorProto ============================================================================== */

typedef struct {
  char *name;
  int64_t data_type;
  bool has_type;
  I64s dims, ints; /* int32_data / int64_data / uint64_data */
  F64s reals;      /* float_data / double_data */
  const uint8_t *raw;
  size_t rawlen;
  int nfields; /* data fields present (at most one kind) */
  int kind;    /* 4 float, 5 int32, 7 int64, 9 raw, 10 double, 11 uint64 */
  bool external;
  const uint8_t *at;
} TP;

static void tp_free(TP *t) {
  free(t->name);
  free(t->dims.v);
  free(t->ints.v);
  free(t->reals.v);
}

static bool tp_kind(PB *pb, TP *t, int kind, const uint8_t *at) {
  if (t->kind && t->kind != kind)
    return pb_fail(
        pb, at, "TensorProto '%s': more than one data field (raw_data, float_data, int32_data, ...) is set",
        t->name ? t->name : "");
  t->kind = kind;
  return true;
}

static bool parse_tensor(PB *pb, Cur c, TP *t) {
  memset(t, 0, sizeof *t);
  t->at = c.p;
  if (!enter(pb, &c, "TensorProto")) return false;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    const uint8_t *at = c.p;
    if (!rd_tag(pb, &c, &f, &wt, "TensorProto")) return false;
    bool ok = true;
    switch (f) {
    case 1:
      ok = rd_ints(pb, &c, wt, &t->dims, "TensorProto.dims");
      break;
    case 2:
      ok = rd_i64(pb, &c, wt, &t->data_type, "TensorProto.data_type");
      t->has_type = true;
      break;
    case 4:
      ok = tp_kind(pb, t, 4, at) && rd_reals(pb, &c, wt, &t->reals, false, "TensorProto.float_data");
      break;
    case 5:
      ok = tp_kind(pb, t, 5, at) && rd_ints(pb, &c, wt, &t->ints, "TensorProto.int32_data");
      break;
    case 6:
      return pb_fail(pb, at, "TensorProto '%s': string tensors are not supported", t->name ? t->name : "");
    case 7:
      ok = tp_kind(pb, t, 7, at) && rd_ints(pb, &c, wt, &t->ints, "TensorProto.int64_data");
      break;
    case 8:
      ok = rd_str(pb, &c, wt, &t->name, "TensorProto.name");
      break;
    case 9: {
      Cur s;
      ok = tp_kind(pb, t, 9, at) && want(pb, &c, wt, 2, "TensorProto.raw_data") &&
           rd_sub(pb, &c, &s, "TensorProto.raw_data");
      if (ok) {
        t->raw = s.p;
        t->rawlen = (size_t)(s.end - s.p);
      }
      break;
    }
    case 10:
      ok = tp_kind(pb, t, 10, at) && rd_reals(pb, &c, wt, &t->reals, true, "TensorProto.double_data");
      break;
    case 11:
      ok = tp_kind(pb, t, 11, at) && rd_ints(pb, &c, wt, &t->ints, "TensorProto.uint64_data");
      break;
    case 13:
      ok = skip_field(pb, &c, wt, "TensorProto.external_data"), t->external = true;
      break;
    case 14: {
      int64_t loc;
      ok = rd_i64(pb, &c, wt, &loc, "TensorProto.data_location");
      if (loc == 1) t->external = true;
      break;
    }
    default:
      ok = skip_field(pb, &c, wt, "TensorProto");
      break;
    }
    if (!ok) return false;
  }
  pb->depth--;
  return true;
}

static tg_dtype onnx_dtype(int64_t t) {
  switch (t) {
  case 1:
    return TG_FLOAT32;
  case 2:
    return TG_UINT8;
  case 3:
    return TG_INT8;
  case 4:
    return TG_UINT16;
  case 5:
    return TG_INT16;
  case 6:
    return TG_INT32;
  case 7:
    return TG_INT64;
  case 9:
    return TG_BOOL;
  case 10:
    return TG_FLOAT16;
  case 11:
    return TG_FLOAT64;
  case 12:
    return TG_UINT32;
  case 13:
    return TG_UINT64;
  case 16:
    return TG_BFLOAT16;
  case 17:
    return TG_FP8E4M3;
  case 18:
    return TG_FP8E4M3FNUZ;
  case 19:
    return TG_FP8E5M2;
  case 20:
    return TG_FP8E5M2FNUZ;
  }
  return TG_DTYPE_DEFAULT;
}
static const char *onnx_dtype_name(int64_t t) {
  static const char *n[] = {"UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
                            "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
                            "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
                            "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                            "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1"};
  return t >= 0 && t < (int64_t)(sizeof n / sizeof n[0]) ? n[t] : "unknown";
}
static bool is_intlike(tg_dtype dt) { return dt == TG_BOOL || tg_dtype_is_int(dt); }

static void put_elem(uint8_t *dst, tg_dtype dt, size_t i, int64_t iv, double dv, bool is_real) {
  switch (dt) {
  case TG_BOOL:
    dst[i] = is_real ? dv != 0 : iv != 0;
    break;
  case TG_INT8:
    ((int8_t *)dst)[i] = (int8_t)iv;
    break;
  case TG_UINT8:
    dst[i] = (uint8_t)iv;
    break;
  case TG_INT16:
    ((int16_t *)dst)[i] = (int16_t)iv;
    break;
  case TG_UINT16:
  case TG_FLOAT16:
  case TG_BFLOAT16:
    ((uint16_t *)dst)[i] = (uint16_t)iv;
    break;
  case TG_FP8E4M3:
  case TG_FP8E5M2:
  case TG_FP8E4M3FNUZ:
  case TG_FP8E5M2FNUZ:
    dst[i] = (uint8_t)iv;
    break;
  case TG_INT32:
    ((int32_t *)dst)[i] = (int32_t)iv;
    break;
  case TG_UINT32:
    ((uint32_t *)dst)[i] = (uint32_t)iv;
    break;
  case TG_INT64:
  case TG_UINT64:
    ((int64_t *)dst)[i] = iv;
    break;
  case TG_FLOAT32:
    ((float *)dst)[i] = (float)dv;
    break;
  case TG_FLOAT64:
    ((double *)dst)[i] = dv;
    break;
  default:
    break;
  }
}

static int64_t get_int_elem(const uint8_t *src, tg_dtype dt, size_t i) {
  switch (dt) {
  case TG_BOOL:
    return src[i] != 0;
  case TG_INT8:
    return ((const int8_t *)src)[i];
  case TG_UINT8:
    return src[i];
  case TG_INT16:
    return ((const int16_t *)src)[i];
  case TG_UINT16:
    return ((const uint16_t *)src)[i];
  case TG_INT32:
    return ((const int32_t *)src)[i];
  case TG_UINT32:
    return ((const uint32_t *)src)[i];
  case TG_INT64:
  case TG_UINT64:
    return ((const int64_t *)src)[i];
  default:
    return 0;
  }
}
static double get_real_elem(const uint8_t *src, tg_dtype dt, size_t i) {
  switch (dt) {
  case TG_FLOAT32:
    return ((const float *)src)[i];
  case TG_FLOAT64:
    return ((const double *)src)[i];
  default:
    return (double)get_int_elem(src, dt, i);
  }
}

/* Creates the tensor of a parsed TensorProto on the model's device as a new Const. */
static bool make_const(PB *pb, tg_onnx *m, TP *t, const char *what, int *out_idx) {
  const char *nm = t->name ? t->name : "";
  if (t->external)
    return pb_fail(
        pb, t->at,
        "%s '%s': its data is stored in an external file, which is not supported (save the model with "
        "the weights inside the .onnx file: onnx.save(model, path, save_as_external_data=False))",
        what, nm);
  if (!t->has_type) return pb_fail(pb, t->at, "%s '%s': TensorProto.data_type is missing", what, nm);
  tg_dtype dt = onnx_dtype(t->data_type);
  if (!dt)
    return pb_fail(pb, t->at, "%s '%s': data type %lld (%s) is not supported", what, nm,
                   (long long)t->data_type, onnx_dtype_name(t->data_type));
  if (t->dims.n > ONNX_MAX_DIMS)
    return pb_fail(pb, t->at, "%s '%s': %zu dimensions (at most %d)", what, nm, t->dims.n, ONNX_MAX_DIMS);
  uint64_t numel = 1;
  for (size_t i = 0; i < t->dims.n; i++) {
    if (t->dims.v[i] < 0)
      return pb_fail(pb, t->at, "%s '%s': negative dimension %lld", what, nm, (long long)t->dims.v[i]);
    if (t->dims.v[i] && numel > (UINT64_MAX >> 1) / (uint64_t)t->dims.v[i])
      return pb_fail(pb, t->at, "%s '%s': the element count overflows", what, nm);
    numel *= (uint64_t)t->dims.v[i];
  }
  size_t isz = tg_dtype_itemsize(dt);
  size_t have;
  switch (t->kind) {
  case 9:
    have = t->rawlen / isz;
    break;
  case 4:
  case 10:
    have = t->reals.n;
    break;
  case 5:
  case 7:
  case 11:
    have = t->ints.n;
    break;
  default:
    have = 0;
  }
  if (t->kind == 9 && t->rawlen % isz)
    return pb_fail(pb, t->at, "%s '%s': raw_data has %zu bytes, not a multiple of %s's %zu", what, nm,
                   t->rawlen, tg_dtype_name(dt), isz);
  if ((uint64_t)have != numel)
    return pb_fail(pb, t->at,
                   "%s '%s': dims say %llu elements but the data holds %zu (truncated or corrupt tensor)",
                   what, nm, (unsigned long long)numel, have);
  /* which typed field may carry which dtype */
  if ((t->kind == 4 && dt != TG_FLOAT32) || (t->kind == 10 && dt != TG_FLOAT64) ||
      (t->kind == 7 && dt != TG_INT64) || (t->kind == 11 && dt != TG_UINT32 && dt != TG_UINT64) ||
      (t->kind == 5 &&
       (dt == TG_FLOAT32 || dt == TG_FLOAT64 || dt == TG_INT64 || dt == TG_UINT32 || dt == TG_UINT64)))
    return pb_fail(pb, t->at, "%s '%s': a %s tensor cannot be stored in that data field", what, nm,
                   tg_dtype_name(dt));
  uint8_t *buf = malloc(numel * isz + 8);
  if (!buf)
    return pb_fail(pb, t->at, "%s '%s': out of memory for %llu elements", what, nm,
                   (unsigned long long)numel);
  if (t->kind == 9) {
    if (numel) memcpy(buf, t->raw, numel * isz);
  } else {
    for (size_t i = 0; i < numel; i++) {
      bool real = t->kind == 4 || t->kind == 10;
      put_elem(buf, dt, i, real ? 0 : t->ints.v[i], real ? t->reals.v[i] : (double)t->ints.v[i], real);
    }
  }
  int64_t shape[ONNX_MAX_DIMS];
  for (size_t i = 0; i < t->dims.n; i++) shape[i] = t->dims.v[i];
  size_t cap = (size_t)m->capconsts;
  if (!grow((void **)&m->consts, &cap, (size_t)m->nconsts, sizeof *m->consts)) {
    free(buf);
    return pb_fail(pb, NULL, "out of memory");
  }
  m->capconsts = (int)cap;
  Const *k = &m->consts[m->nconsts];
  memset(k, 0, sizeof *k);
  k->dt = dt;
  if (numel == 1) {
    k->has_scalar = true;
    k->scalar = dt == TG_FLOAT16 || dt == TG_BFLOAT16 || dt >= TG_FP8E4M3 ? NAN : get_real_elem(buf, dt, 0);
    if (dt == TG_FLOAT16 || dt == TG_BFLOAT16 || dt >= TG_FP8E4M3) k->has_scalar = false;
  }
  if (is_intlike(dt) && numel <= ONNX_HOST_MAX) {
    k->h = host_new(dt, shape, (int)t->dims.n);
    if (!k->h) {
      free(buf);
      return pb_fail(pb, NULL, "out of memory");
    }
    for (size_t i = 0; i < numel; i++) k->h->v[i] = get_int_elem(buf, dt, i);
  } else if ((dt == TG_FLOAT32 || dt == TG_FLOAT64) && numel <= ONNX_HOST_REALS) {
    k->fv = malloc((numel ? numel : 1) * sizeof *k->fv);
    if (!k->fv) {
      free(buf);
      return pb_fail(pb, NULL, "out of memory");
    }
    for (size_t i = 0; i < numel; i++) k->fv[i] = get_real_elem(buf, dt, i);
    k->nfv = (int64_t)numel;
  }
  k->t = tg_from_data(buf, shape, (int)t->dims.n,
                      &(tg_opts){.dtype = dt, .device = m->device, .requires_grad = false});
  free(buf);
  if (!tg_valid(k->t)) {
    host_free(k->h);
    free(k->fv);
    error_restate(TG_ERR_IO, NULL, "%s: %s: %s '%s'", pb->fn, pb->path, what, nm);
    return false;
  }
  tg_persist(k->t);
  *out_idx = m->nconsts++;
  return true;
}

/* ==== AttributeProto / NodeProto ============================================================== */

static void attr_free(Attr *a) {
  free(a->name);
  free(a->s);
  free(a->ints.v);
  free(a->floats.v);
}

static bool parse_attr(PB *pb, tg_onnx *m, Cur c, Attr *a) {
  memset(a, 0, sizeof *a);
  a->t = -1;
  if (!enter(pb, &c, "AttributeProto")) return false;
  const uint8_t *start = c.p;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    const uint8_t *at = c.p;
    if (!rd_tag(pb, &c, &f, &wt, "AttributeProto")) return false;
    bool ok = true;
    switch (f) {
    case 1:
      ok = rd_str(pb, &c, wt, &a->name, "AttributeProto.name");
      break;
    case 2: {
      F64s one = {0};
      ok = want(pb, &c, wt, 5, "AttributeProto.f") && rd_reals(pb, &c, wt, &one, false, "AttributeProto.f");
      if (ok) a->f = one.v[0], a->has_f = true;
      free(one.v);
      break;
    }
    case 3:
      ok = rd_i64(pb, &c, wt, &a->i, "AttributeProto.i"), a->has_i = true;
      break;
    case 4:
      ok = rd_str(pb, &c, wt, &a->s, "AttributeProto.s"), a->has_s = true;
      break;
    case 5: {
      Cur s;
      TP t;
      if (!want(pb, &c, wt, 2, "AttributeProto.t") || !rd_sub(pb, &c, &s, "AttributeProto.t")) return false;
      if (a->t >= 0)
        return pb_fail(pb, at, "attribute '%s': more than one tensor value", a->name ? a->name : "");
      ok = parse_tensor(pb, s, &t) && make_const(pb, m, &t, "attribute tensor", &a->t);
      tp_free(&t);
      a->has_t = ok;
      break;
    }
    case 6:
      ok = skip_field(pb, &c, wt, "AttributeProto.g"), a->has_g = true;
      break;
    case 7:
      ok = rd_reals(pb, &c, wt, &a->floats, false, "AttributeProto.floats");
      break;
    case 8:
      ok = rd_ints(pb, &c, wt, &a->ints, "AttributeProto.ints");
      break;
    case 20: {
      int64_t ty;
      ok = rd_i64(pb, &c, wt, &ty, "AttributeProto.type");
      a->type = ty >= 1 && ty <= 8 ? (int)ty : AT_OTHER;
      break;
    }
    case 21:
      return pb_fail(pb, at, "attribute '%s': references to function attributes are not supported",
                     a->name ? a->name : "");
    default:
      ok = skip_field(pb, &c, wt, "AttributeProto");
      break;
    }
    if (!ok) return false;
  }
  if (!a->name || !*a->name) return pb_fail(pb, start, "AttributeProto without a name");
  if (a->type == AT_UNDEF) { /* old files: infer from the field set */
    a->type = a->has_f      ? AT_FLOAT
              : a->has_i    ? AT_INT
              : a->has_s    ? AT_STRING
              : a->has_t    ? AT_TENSOR
              : a->has_g    ? AT_GRAPH
              : a->floats.n ? AT_FLOATS
              : a->ints.n   ? AT_INTS
                            : AT_OTHER;
  }
  pb->depth--;
  return true;
}

static void node_free(Node *n) {
  free(n->name);
  free(n->op);
  free(n->domain);
  free(n->in);
  free(n->out);
  for (int i = 0; i < n->nat; i++) attr_free(&n->at[i]);
  free(n->at);
}

typedef struct {
  char **v;
  size_t n, cap;
} Strs;
static void strs_free(Strs *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
}

static bool parse_node(PB *pb, tg_onnx *m, Cur c, Node *n) {
  memset(n, 0, sizeof *n);
  Strs ins = {0}, outs = {0};
  size_t capat = 0;
  bool ok = enter(pb, &c, "NodeProto");
  const uint8_t *start = c.p;
  while (ok && c.p < c.end) {
    uint32_t f;
    int wt;
    if (!rd_tag(pb, &c, &f, &wt, "NodeProto")) {
      ok = false;
      break;
    }
    switch (f) {
    case 1:
    case 2: {
      Strs *s = f == 1 ? &ins : &outs;
      char *str = NULL;
      ok = rd_str(pb, &c, wt, &str, f == 1 ? "NodeProto.input" : "NodeProto.output");
      if (ok && !grow((void **)&s->v, &s->cap, s->n, sizeof *s->v)) ok = pb_fail(pb, c.p, "out of memory");
      if (ok)
        s->v[s->n++] = str;
      else
        free(str);
      break;
    }
    case 3:
      ok = rd_str(pb, &c, wt, &n->name, "NodeProto.name");
      break;
    case 4:
      ok = rd_str(pb, &c, wt, &n->op, "NodeProto.op_type");
      break;
    case 5: {
      Cur s;
      ok = want(pb, &c, wt, 2, "NodeProto.attribute") && rd_sub(pb, &c, &s, "NodeProto.attribute");
      if (ok && !grow((void **)&n->at, &capat, (size_t)n->nat, sizeof *n->at))
        ok = pb_fail(pb, c.p, "out of memory");
      if (ok) {
        ok = parse_attr(pb, m, s, &n->at[n->nat]);
        if (ok)
          n->nat++;
        else
          attr_free(&n->at[n->nat]);
      }
      break;
    }
    case 7:
      ok = rd_str(pb, &c, wt, &n->domain, "NodeProto.domain");
      break;
    default:
      ok = skip_field(pb, &c, wt, "NodeProto");
      break;
    }
  }
  if (ok && (!n->op || !*n->op))
    ok = pb_fail(pb, start, "NodeProto '%s' without an op_type", n->name ? n->name : "");
  if (ok) {
    n->nin = (int)ins.n;
    n->nout = (int)outs.n;
    n->in = malloc((ins.n + 1) * sizeof *n->in);
    n->out = malloc((outs.n + 1) * sizeof *n->out);
    if (!n->in || !n->out) ok = pb_fail(pb, NULL, "out of memory");
    for (size_t i = 0; ok && i < ins.n; i++)
      if ((n->in[i] = *ins.v[i] ? val_get(m, ins.v[i]) : -1) < 0 && *ins.v[i])
        ok = pb_fail(pb, NULL, "out of memory");
    for (size_t i = 0; ok && i < outs.n; i++)
      if ((n->out[i] = *outs.v[i] ? val_get(m, outs.v[i]) : -1) < 0 && *outs.v[i])
        ok = pb_fail(pb, NULL, "out of memory");
    for (int i = 0; ok && i < n->nat; i++)
      for (int j = 0; j < i; j++)
        if (!strcmp(n->at[i].name, n->at[j].name)) {
          ok = pb_fail(pb, start, "node '%s' (%s): attribute '%s' is given twice", n->name ? n->name : "",
                       n->op, n->at[i].name);
          break;
        }
  }
  if (ok && !n->name && !(n->name = strdup(""))) ok = pb_fail(pb, NULL, "out of memory");
  strs_free(&ins);
  strs_free(&outs);
  if (ok) pb->depth--;
  return ok;
}

/* ==== ValueInfoProto ========================================================================== */

static bool parse_dims(PB *pb, Cur c, VInfo *v) {
  if (!enter(pb, &c, "TensorShapeProto")) return false;
  v->ndim = 0;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    if (!rd_tag(pb, &c, &f, &wt, "TensorShapeProto")) return false;
    if (f != 1) {
      if (!skip_field(pb, &c, wt, "TensorShapeProto")) return false;
      continue;
    }
    Cur d;
    if (!want(pb, &c, wt, 2, "TensorShapeProto.dim") || !rd_sub(pb, &c, &d, "TensorShapeProto.dim"))
      return false;
    if (v->ndim == ONNX_MAX_DIMS)
      return pb_fail(pb, d.p, "value '%s': more than %d dimensions", v->name ? v->name : "", ONNX_MAX_DIMS);
    int k = v->ndim++;
    v->shape[k] = -1;
    if (!enter(pb, &d, "TensorShapeProto.Dimension")) return false;
    while (d.p < d.end) {
      uint32_t g;
      int wt2;
      if (!rd_tag(pb, &d, &g, &wt2, "TensorShapeProto.Dimension")) return false;
      if (g == 1) {
        if (!rd_i64(pb, &d, wt2, &v->shape[k], "TensorShapeProto.Dimension.dim_value")) return false;
        if (v->shape[k] < 0) v->shape[k] = -1;
      } else if (g == 2) {
        if (!rd_str(pb, &d, wt2, &v->dimparam[k], "TensorShapeProto.Dimension.dim_param")) return false;
      } else if (!skip_field(pb, &d, wt2, "TensorShapeProto.Dimension"))
        return false;
    }
    pb->depth--;
  }
  pb->depth--;
  return true;
}

static bool parse_vinfo(PB *pb, Cur c, VInfo *v) {
  memset(v, 0, sizeof *v);
  v->ndim = -1;
  v->val = -1;
  if (!enter(pb, &c, "ValueInfoProto")) return false;
  const uint8_t *start = c.p;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    if (!rd_tag(pb, &c, &f, &wt, "ValueInfoProto")) return false;
    if (f == 1) {
      if (!rd_str(pb, &c, wt, &v->name, "ValueInfoProto.name")) return false;
    } else if (f == 2) { /* TypeProto */
      Cur t;
      if (!want(pb, &c, wt, 2, "ValueInfoProto.type") || !rd_sub(pb, &c, &t, "ValueInfoProto.type"))
        return false;
      if (!enter(pb, &t, "TypeProto")) return false;
      while (t.p < t.end) {
        uint32_t g;
        int wt2;
        if (!rd_tag(pb, &t, &g, &wt2, "TypeProto")) return false;
        if (g == 1) {
          Cur tt;
          if (!want(pb, &t, wt2, 2, "TypeProto.tensor_type") || !rd_sub(pb, &t, &tt, "TypeProto.tensor_type"))
            return false;
          if (!enter(pb, &tt, "TypeProto.Tensor")) return false;
          while (tt.p < tt.end) {
            uint32_t h;
            int wt3;
            if (!rd_tag(pb, &tt, &h, &wt3, "TypeProto.Tensor")) return false;
            if (h == 1) {
              int64_t et;
              if (!rd_i64(pb, &tt, wt3, &et, "TypeProto.Tensor.elem_type")) return false;
              v->dt = onnx_dtype(et);
              if (!v->dt && et != 0)
                return pb_fail(pb, tt.p, "value '%s': element type %lld (%s) is not supported",
                               v->name ? v->name : "", (long long)et, onnx_dtype_name(et));
            } else if (h == 2) {
              Cur s;
              if (!want(pb, &tt, wt3, 2, "TypeProto.Tensor.shape") ||
                  !rd_sub(pb, &tt, &s, "TypeProto.Tensor.shape") || !parse_dims(pb, s, v))
                return false;
            } else if (!skip_field(pb, &tt, wt3, "TypeProto.Tensor"))
              return false;
          }
          pb->depth--;
        } else {
          if (g == 4 || g == 5 || g == 8 || g == 9) v->not_tensor = true;
          if (!skip_field(pb, &t, wt2, "TypeProto")) return false;
        }
      }
      pb->depth--;
    } else if (!skip_field(pb, &c, wt, "ValueInfoProto"))
      return false;
  }
  if (!v->name || !*v->name) return pb_fail(pb, start, "graph input or output without a name");
  pb->depth--;
  return true;
}

static void vinfo_free(VInfo *v) {
  free(v->name);
  for (int i = 0; i < ONNX_MAX_DIMS; i++) free(v->dimparam[i]);
}

/* ==== GraphProto / ModelProto ================================================================= */

static bool parse_graph(PB *pb, tg_onnx *m, Cur c) {
  if (!enter(pb, &c, "GraphProto")) return false;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    const uint8_t *at = c.p;
    if (!rd_tag(pb, &c, &f, &wt, "GraphProto")) return false;
    Cur s;
    switch (f) {
    case 1: {
      if (!want(pb, &c, wt, 2, "GraphProto.node") || !rd_sub(pb, &c, &s, "GraphProto.node")) return false;
      size_t cap = (size_t)m->capnodes;
      if (!grow((void **)&m->nodes, &cap, (size_t)m->nnodes, sizeof *m->nodes))
        return pb_fail(pb, at, "out of memory");
      m->capnodes = (int)cap;
      if (!parse_node(pb, m, s, &m->nodes[m->nnodes])) {
        node_free(&m->nodes[m->nnodes]);
        return false;
      }
      m->nnodes++;
      break;
    }
    case 5: {
      TP t;
      int idx;
      if (!want(pb, &c, wt, 2, "GraphProto.initializer") || !rd_sub(pb, &c, &s, "GraphProto.initializer"))
        return false;
      bool ok = parse_tensor(pb, s, &t);
      if (ok && (!t.name || !*t.name)) ok = pb_fail(pb, at, "GraphProto.initializer without a name");
      if (ok) {
        int id = val_get(m, t.name);
        if (id < 0)
          ok = pb_fail(pb, at, "out of memory");
        else if (m->vals[id].kind != V_UNDEF)
          ok = pb_fail(pb, at, "initializer '%s' is defined twice (duplicate names; corrupt file?)", t.name);
        else if ((ok = make_const(pb, m, &t, "initializer", &idx))) {
          m->vals[id].kind = V_CONST;
          m->vals[id].ref = idx;
        }
      }
      tp_free(&t);
      if (!ok) return false;
      break;
    }
    case 11:
    case 12: {
      const char *fld = f == 11 ? "GraphProto.input" : "GraphProto.output";
      if (!want(pb, &c, wt, 2, fld) || !rd_sub(pb, &c, &s, fld)) return false;
      VInfo **arr = f == 11 ? &m->inputs : &m->outputs;
      int *n = f == 11 ? &m->ninputs : &m->noutputs, *capi = f == 11 ? &m->capin : &m->capout;
      size_t cap = (size_t)*capi;
      if (!grow((void **)arr, &cap, (size_t)*n, sizeof **arr)) return pb_fail(pb, at, "out of memory");
      *capi = (int)cap;
      if (!parse_vinfo(pb, s, &(*arr)[*n])) {
        vinfo_free(&(*arr)[*n]);
        return false;
      }
      (*n)++;
      break;
    }
    case 15:
      return pb_fail(
          pb, at,
          "GraphProto.sparse_initializer: sparse tensors are not supported (densify them before export)");
    default:
      if (!skip_field(pb, &c, wt, "GraphProto")) return false;
    }
  }
  pb->depth--;
  return true;
}

static bool parse_model(PB *pb, tg_onnx *m, Cur c) {
  bool have_graph = false;
  Cur graph = {0};
  m->opset = -1;
  while (c.p < c.end) {
    uint32_t f;
    int wt;
    const uint8_t *at = c.p;
    if (!rd_tag(pb, &c, &f, &wt, "ModelProto")) return false;
    if (f == 7) {
      if (have_graph) return pb_fail(pb, at, "ModelProto.graph appears twice (corrupt file?)");
      if (!want(pb, &c, wt, 2, "ModelProto.graph") || !rd_sub(pb, &c, &graph, "ModelProto.graph"))
        return false;
      have_graph = true;
    } else if (f == 8) {
      Cur s;
      char *domain = NULL;
      int64_t version = 1;
      if (!want(pb, &c, wt, 2, "ModelProto.opset_import") || !rd_sub(pb, &c, &s, "ModelProto.opset_import"))
        return false;
      while (s.p < s.end) {
        uint32_t g;
        int wt2;
        bool ok = rd_tag(pb, &s, &g, &wt2, "OperatorSetIdProto");
        if (ok) {
          if (g == 1)
            ok = rd_str(pb, &s, wt2, &domain, "OperatorSetIdProto.domain");
          else if (g == 2)
            ok = rd_i64(pb, &s, wt2, &version, "OperatorSetIdProto.version");
          else
            ok = skip_field(pb, &s, wt2, "OperatorSetIdProto");
        }
        if (!ok) {
          free(domain);
          return false;
        }
      }
      if (!domain || !*domain || !strcmp(domain, "ai.onnx")) m->opset = version;
      free(domain);
    } else if (!skip_field(pb, &c, wt, "ModelProto"))
      return false;
  }
  if (!have_graph)
    return pb_fail(pb, NULL,
                   "ModelProto.graph is missing (not an ONNX model file? an empty or truncated file?)");
  if (m->opset < 0) m->opset = 1;
  if (m->opset < 1 || m->opset > 1000)
    return pb_fail(pb, NULL, "opset_import: default-domain opset version %lld is not valid",
                   (long long)m->opset);
  return parse_graph(pb, m, graph);
}

/* ==== runtime ================================================================================= */

typedef struct {
  tg_tensor t; /* none until needed for host values */
  HostVal *h;
  bool own_h;
} RV;

typedef struct {
  tg_onnx *m;
  RV *v;
  const Node *n;
} Run;

typedef struct OpDef {
  const char *name;
  bool (*fn)(Run *r, const Node *n);
  int (*fold)(Run *r, const Node *n); /* host evaluation: 1 done, 0 not applicable, -1 error */
  int min_in, max_in, max_out;
} OpDef;

/* An op's error (false): the thread's error, which the run prefixes with the node */
static bool as_false(tg_status st) { return (void)st, false; }
#define op_fail(r, ...) ((void)(r), as_false(tg_set_error(TG_ERR_INVALID, __VA_ARGS__)))

/* ---- attributes ---- */
static const Attr *attr(const Node *n, const char *name) {
  for (int i = 0; i < n->nat; i++)
    if (!strcmp(n->at[i].name, name)) return &n->at[i];
  return NULL;
}
/* An attribute of the wrong type is an error of the node that reads it (reported by run_node once
 * the op returns), never a silent fall back to the default. */
static _Thread_local const Attr *tl_bad_attr;
static _Thread_local const char *tl_bad_want;
static const char *const attr_type_names[] = {"UNDEFINED", "FLOAT", "INT",    "STRING", "TENSOR",
                                              "GRAPH",     "FLOATS", "INTS", "STRINGS", "another type"};
/* a, when it has the type the caller reads (ok); otherwise NULL, the first such attribute recorded */
static const Attr *typed(const Attr *a, bool ok, const char *want) {
  if (!a || ok) return a;
  if (!tl_bad_attr) tl_bad_attr = a, tl_bad_want = want;
  return NULL;
}
static int64_t ai(const Node *n, const char *name, int64_t def) {
  const Attr *a = attr(n, name);
  a = typed(a, a && a->type == AT_INT, "INT");
  return a ? a->i : def;
}
static double af(const Node *n, const char *name, double def) {
  const Attr *a = attr(n, name);
  a = typed(a, a && (a->type == AT_FLOAT || a->type == AT_INT), "FLOAT");
  return a ? (a->type == AT_FLOAT ? a->f : (double)a->i) : def;
}
static const char *as(const Node *n, const char *name, const char *def) {
  const Attr *a = attr(n, name);
  a = typed(a, a && a->type == AT_STRING, "STRING");
  return a && a->s ? a->s : def; /* (a writer may leave out an empty string's bytes) */
}
static const I64s *aints(const Node *n, const char *name) {
  const Attr *a = attr(n, name);
  a = typed(a, a && (a->type == AT_INTS || (a->type == AT_OTHER && a->ints.n)), "INTS");
  return a ? &a->ints : NULL;
}

/* ---- inputs / outputs ---- */
static bool has_in(const Node *n, int k) { return k < n->nin && n->in[k] >= 0; }

static tg_tensor host_tensor(tg_onnx *m, const HostVal *h) {
  size_t isz = tg_dtype_itemsize(h->dt);
  uint8_t *buf = malloc((size_t)(h->n ? h->n : 1) * isz);
  if (!buf) {
    tg_set_error(TG_ERR_RUNTIME, "tg_onnx_run: out of memory");
    return (tg_tensor){0};
  }
  for (int64_t i = 0; i < h->n; i++) put_elem(buf, h->dt, (size_t)i, h->v[i], (double)h->v[i], false);
  tg_tensor t = tg_from_data(buf, h->shape, h->ndim,
                             &(tg_opts){.dtype = h->dt, .device = m->device, .requires_grad = false});
  free(buf);
  return t;
}

static tg_tensor IN(Run *r, const Node *n, int k) {
  if (!has_in(n, k)) return (tg_tensor){0};
  RV *v = &r->v[n->in[k]];
  if (!v->t.id && v->h) v->t = host_tensor(r->m, v->h);
  return v->t;
}

/* The host copy of input k: known, or read from its tensor (integer tensors only). NULL + error. */
static HostVal *HIN(Run *r, const Node *n, int k, const char *what) {
  if (!has_in(n, k)) return op_fail(r, "input %d (%s) is missing", k, what), NULL;
  RV *v = &r->v[n->in[k]];
  if (v->h) return v->h;
  tg_tensor t = v->t;
  int64_t numel = tg_numel(t);
  if (numel < 0) return NULL;
  if (numel > ONNX_HOST_MAX)
    return op_fail(r, "input %d (%s) has %lld elements; a shape argument may have at most %d", k, what,
                   (long long)numel, ONNX_HOST_MAX),
           NULL;
  int64_t shape[ONNX_MAX_DIMS];
  int nd = tg_shape(t, shape);
  if (nd < 0) return NULL;
  tg_dtype dt = tg_dtype_of(t);
  tg_tensor c = tg_cast(t, TG_INT64);
  HostVal *h = host_new(is_intlike(dt) ? dt : TG_INT64, shape, nd);
  if (!h) return op_fail(r, "out of memory"), NULL;
  if (tg_data(c, h->v, (size_t)(numel ? numel : 1) * 8) != TG_OK) {
    host_free(h);
    return NULL;
  }
  v->h = h;
  v->own_h = true;
  return h;
}

/* A scalar argument (one element) as double: from a constant, the host, or the tensor. */
static bool scalar_in(Run *r, const Node *n, int k, double *out) {
  RV *v = &r->v[n->in[k]];
  if (v->h) {
    if (v->h->n != 1) return op_fail(r, "input %d must have one element, not %lld", k, (long long)v->h->n);
    *out = (double)v->h->v[0];
    return true;
  }
  const Value *val = &r->m->vals[n->in[k]];
  if (val->kind == V_CONST && r->m->consts[val->ref].has_scalar) {
    *out = r->m->consts[val->ref].scalar;
    return true;
  }
  tg_tensor t = IN(r, n, k);
  if (tg_numel(t) != 1)
    return op_fail(r, "input %d must have one element, not %lld", k, (long long)tg_numel(t));
  return tg_item(t, out) == TG_OK;
}

static void set_out(Run *r, const Node *n, int k, tg_tensor t) {
  if (k < n->nout && n->out[k] >= 0) r->v[n->out[k]].t = t;
}
static void set_host(Run *r, const Node *n, int k, HostVal *h) {
  if (k < n->nout && n->out[k] >= 0) {
    r->v[n->out[k]].h = h;
    r->v[n->out[k]].own_h = true;
  } else
    host_free(h);
}
static bool out1(Run *r, const Node *n, tg_tensor t) {
  if (!tg_valid(t)) return false;
  set_out(r, n, 0, t);
  return true;
}

static int rank(tg_tensor t) { return tg_ndim(t); }
static bool norm_axis(Run *r, int64_t *axis, int nd, const char *what) {
  if (*axis < -nd || *axis >= (nd ? nd : 1))
    return op_fail(r, "%s %lld is out of range for a %d-d tensor", what, (long long)*axis, nd);
  if (*axis < 0) *axis += nd;
  return true;
}

/* ==== host folding of small integer tensors ===================================================== */

static bool all_host(Run *r, const Node *n, int upto) {
  for (int k = 0; k < n->nin && k < upto; k++)
    if (n->in[k] >= 0 && !r->v[n->in[k]].h) return false;
  return true;
}

/* Broadcasts up to 3 host inputs numpy-style and maps f over them. 0 when shapes do not broadcast or
 * the result is too big (the tensor op then reports or computes it). */
static int host_map(Run *r, const Node *n, const HostVal **in, int nin, tg_dtype outdt,
                    int64_t (*f)(const int64_t *a, bool *ok)) {
  int nd = 0;
  for (int i = 0; i < nin; i++)
    if (in[i]->ndim > nd) nd = in[i]->ndim;
  int64_t shape[ONNX_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++) {
    int64_t s = 1;
    for (int i = 0; i < nin; i++) {
      int k = d - (nd - in[i]->ndim);
      int64_t di = k >= 0 ? in[i]->shape[k] : 1;
      if (di != 1) {
        if (s != 1 && s != di) return 0;
        s = di;
      }
    }
    for (int i = 0; i < nin; i++) {
      int k = d - (nd - in[i]->ndim);
      if (k >= 0 && in[i]->shape[k] == 0) s = 0;
    }
    shape[d] = s;
  }
  int64_t numel = 1;
  for (int d = 0; d < nd; d++)
    if (shape[d] == 0) numel = 0;
  for (int d = 0; d < nd && numel; d++)
    if ((numel *= shape[d]) > ONNX_HOST_MAX) return 0;
  HostVal *h = host_new(outdt, shape, nd);
  if (!h) return op_fail(r, "out of memory"), -1;
  for (int64_t o = 0; o < numel; o++) {
    int64_t args[3], rem = o, off[3] = {0, 0, 0}, mul[3] = {1, 1, 1};
    for (int d = nd - 1; d >= 0; d--) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      for (int i = 0; i < nin; i++) {
        int k = d - (nd - in[i]->ndim);
        if (k < 0) continue;
        if (in[i]->shape[k] != 1) off[i] += idx * mul[i];
        mul[i] *= in[i]->shape[k];
      }
    }
    for (int i = 0; i < nin; i++) args[i] = in[i]->v[off[i]];
    bool ok = true;
    int64_t v = f(args, &ok);
    if (!ok) {
      host_free(h);
      return 0;
    }
    h->v[o] = outdt == TG_BOOL ? v != 0 : v;
  }
  set_host(r, n, 0, h);
  return 1;
}

static int64_t hf_add(const int64_t *a, bool *ok) {
  (void)ok;
  return (int64_t)((uint64_t)a[0] + (uint64_t)a[1]);
}
static int64_t hf_sub(const int64_t *a, bool *ok) {
  (void)ok;
  return (int64_t)((uint64_t)a[0] - (uint64_t)a[1]);
}
static int64_t hf_mul(const int64_t *a, bool *ok) {
  (void)ok;
  return (int64_t)((uint64_t)a[0] * (uint64_t)a[1]);
}
static int64_t hf_div(const int64_t *a, bool *ok) {
  if (a[1] == 0 || (a[0] == INT64_MIN && a[1] == -1)) return *ok = false, 0;
  return a[0] / a[1];
}
static int64_t hf_eq(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] == a[1];
}
static int64_t hf_lt(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] < a[1];
}
static int64_t hf_gt(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] > a[1];
}
static int64_t hf_le(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] <= a[1];
}
static int64_t hf_ge(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] >= a[1];
}
static int64_t hf_and(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] && a[1];
}
static int64_t hf_or(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] || a[1];
}
static int64_t hf_max(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] > a[1] ? a[0] : a[1];
}
static int64_t hf_min(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] < a[1] ? a[0] : a[1];
}
static int64_t hf_where(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] ? a[1] : a[2];
}
static int64_t hf_neg(const int64_t *a, bool *ok) {
  (void)ok;
  return (int64_t)(0 - (uint64_t)a[0]);
}
static int64_t hf_abs(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0] < 0 ? (int64_t)(0 - (uint64_t)a[0]) : a[0];
}
static int64_t hf_not(const int64_t *a, bool *ok) {
  (void)ok;
  return !a[0];
}
static int64_t hf_id(const int64_t *a, bool *ok) {
  (void)ok;
  return a[0];
}

static int fold_map(Run *r, const Node *n, int nin, bool cmp, int64_t (*f)(const int64_t *, bool *)) {
  if (n->nin < nin || !all_host(r, n, nin)) return 0;
  const HostVal *in[3];
  tg_dtype dt = TG_DTYPE_DEFAULT;
  for (int i = 0; i < nin; i++) {
    if (n->in[i] < 0) return 0;
    in[i] = r->v[n->in[i]].h;
    if (f == hf_where && i == 0) continue;
    dt = dt ? tg_dtype_promote(dt, in[i]->dt) : in[i]->dt;
  }
  return host_map(r, n, in, nin, cmp ? TG_BOOL : dt, f);
}
#define FOLD2(NAME, F, CMP)                                                                                  \
  static int fold_##NAME(Run *r, const Node *n) { return fold_map(r, n, 2, CMP, F); }
FOLD2(Add, hf_add, false)
FOLD2(Sub, hf_sub, false)
FOLD2(Mul, hf_mul, false)
FOLD2(Div, hf_div, false)
FOLD2(Equal, hf_eq, true)
FOLD2(Less, hf_lt, true)
FOLD2(Greater, hf_gt, true)
FOLD2(LessOrEqual, hf_le, true)
FOLD2(GreaterOrEqual, hf_ge, true)
FOLD2(And, hf_and, true)
FOLD2(Or, hf_or, true)
static int fold_Max(Run *r, const Node *n) { return n->nin == 2 ? fold_map(r, n, 2, false, hf_max) : 0; }
static int fold_Min(Run *r, const Node *n) { return n->nin == 2 ? fold_map(r, n, 2, false, hf_min) : 0; }
static int fold_Where(Run *r, const Node *n) { return fold_map(r, n, 3, false, hf_where); }
static int fold_Neg(Run *r, const Node *n) { return fold_map(r, n, 1, false, hf_neg); }
static int fold_Abs(Run *r, const Node *n) { return fold_map(r, n, 1, false, hf_abs); }
static int fold_Not(Run *r, const Node *n) { return fold_map(r, n, 1, true, hf_not); }

/* a copy of h with another shape (same number of elements) */
static int fold_reshaped(Run *r, const Node *n, const HostVal *h, const int64_t *shape, int nd) {
  int64_t numel = 1;
  for (int i = 0; i < nd; i++) numel *= shape[i];
  if (numel != h->n || nd > ONNX_MAX_DIMS) return 0;
  HostVal *o = host_new(h->dt, shape, nd);
  if (!o) return op_fail(r, "out of memory"), -1;
  if (h->n) memcpy(o->v, h->v, (size_t)h->n * sizeof *o->v);
  set_host(r, n, 0, o);
  return 1;
}

static tg_dtype cast_target(const Node *n) { return onnx_dtype(ai(n, "to", 0)); }

static int fold_Cast(Run *r, const Node *n) {
  tg_dtype to = cast_target(n);
  if (!all_host(r, n, 1) || !is_intlike(to)) return 0;
  const HostVal *h = r->v[n->in[0]].h;
  HostVal *o = host_new(to, h->shape, h->ndim);
  if (!o) return op_fail(r, "out of memory"), -1;
  for (int64_t i = 0; i < h->n; i++) {
    uint8_t tmp[8];
    put_elem(tmp, to, 0, h->v[i], (double)h->v[i], false);
    o->v[i] = get_int_elem(tmp, to, 0);
  }
  set_host(r, n, 0, o);
  return 1;
}

static int fold_Identity(Run *r, const Node *n) {
  if (!all_host(r, n, 1)) return 0;
  const HostVal *h = r->v[n->in[0]].h;
  return fold_reshaped(r, n, h, h->shape, h->ndim);
}

/* ==== op helpers ================================================================================ */

/* the static shape of input k, from its host copy or its tensor */
static int in_shape(Run *r, const Node *n, int k, int64_t *shape) {
  RV *v = &r->v[n->in[k]];
  if (v->h && !v->t.id) {
    memcpy(shape, v->h->shape, (size_t)v->h->ndim * sizeof *shape);
    return v->h->ndim;
  }
  int nd = tg_ndim(v->t);
  if (nd > ONNX_MAX_DIMS) return op_fail(r, "a %d-d tensor (at most %d dims)", nd, ONNX_MAX_DIMS), -1;
  return tg_shape(v->t, shape);
}

/* ---- Shape / Size ---- */
static int fold_Shape(Run *r, const Node *n) {
  int64_t shape[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, shape);
  if (nd < 0) return -1;
  int64_t s = ai(n, "start", 0), e = ai(n, "end", nd);
  if (s < 0) s += nd;
  if (e < 0) e += nd;
  s = s < 0 ? 0 : s > nd ? nd : s;
  e = e < 0 ? 0 : e > nd ? nd : e;
  int64_t len = e > s ? e - s : 0;
  HostVal *h = host_new(TG_INT64, &len, 1);
  if (!h) return op_fail(r, "out of memory"), -1;
  for (int64_t i = 0; i < len; i++) h->v[i] = shape[s + i];
  set_host(r, n, 0, h);
  return 1;
}
static int fold_Size(Run *r, const Node *n) {
  int64_t shape[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, shape);
  if (nd < 0) return -1;
  HostVal *h = host_new(TG_INT64, NULL, 0);
  if (!h) return op_fail(r, "out of memory"), -1;
  h->v[0] = 1;
  for (int i = 0; i < nd; i++) h->v[0] *= shape[i];
  set_host(r, n, 0, h);
  return 1;
}
static bool op_Shape(Run *r, const Node *n) { return fold_Shape(r, n) == 1; }
static bool op_Size(Run *r, const Node *n) { return fold_Size(r, n) == 1; }

/* ---- elementwise ---- */
#define UNARY(NAME, EXPR)                                                                                    \
  static bool op_##NAME(Run *r, const Node *n) {                                                             \
    tg_tensor x = IN(r, n, 0);                                                                               \
    return out1(r, n, EXPR);                                                                                 \
  }
UNARY(Relu, tg_relu(x))
UNARY(Sigmoid, tg_sigmoid(x))
UNARY(Tanh, tg_tanh(x))
UNARY(Exp, tg_exp(x))
UNARY(Log, tg_log(x))
UNARY(Sqrt, tg_sqrt(x))
UNARY(Neg, tg_neg(x))
UNARY(Abs, tg_abs(x))
UNARY(Reciprocal, tg_reciprocal(x))
UNARY(Floor, tg_floor(x))
UNARY(Ceil, tg_ceil(x))
UNARY(Round, tg_round(x))
UNARY(Sin, tg_sin(x))
UNARY(Cos, tg_cos(x))
UNARY(Tan, tg_tan(x))
UNARY(Erf, tg_erf(x))
UNARY(Not, tg_logical_not(x))
UNARY(Sign, tg_sign(x))
UNARY(Softsign, tg_softsign(x))
UNARY(HardSwish, tg_hardswish(x))
UNARY(Mish, tg_mish(x))
UNARY(IsNaN, tg_isnan(x))
UNARY(LeakyRelu, tg_leaky_relu(x, af(n, "alpha", 0.01)))
UNARY(Elu, tg_elu(x, af(n, "alpha", 1.0)))
UNARY(Celu, tg_celu(x, af(n, "alpha", 1.0)))
UNARY(Selu,
      tg_selu_ex(x, af(n, "alpha", 1.67326319217681884765625), af(n, "gamma", 1.05070102214813232421875)))
UNARY(HardSigmoid, tg_hardsigmoid_ex(x, af(n, "alpha", 0.2), af(n, "beta", 0.5)))
UNARY(Softplus, tg_softplus(x, 1.0))
UNARY(Gelu, tg_gelu_ex(x, strcmp(as(n, "approximate", "none"), "tanh") ? "none" : "tanh"))
UNARY(IsInf, tg_isinf_ex(x, ai(n, "detect_positive", 1) != 0, ai(n, "detect_negative", 1) != 0))

static bool op_Identity(Run *r, const Node *n) { return out1(r, n, IN(r, n, 0)); }

static bool op_Dropout(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  if (!out1(r, n, x)) return false;
  if (n->nout > 1 && n->out[1] >= 0)
    set_out(r, n, 1, tg_ones_like(x, &(tg_opts){.dtype = TG_BOOL, .requires_grad = TG_GRAD_UNSET}));
  return n->nout < 2 || n->out[1] < 0 || tg_valid(r->v[n->out[1]].t);
}

#define BINARY(NAME, EXPR)                                                                                   \
  static bool op_##NAME(Run *r, const Node *n) {                                                             \
    tg_tensor a = IN(r, n, 0), b = IN(r, n, 1);                                                              \
    return out1(r, n, EXPR);                                                                                 \
  }
BINARY(Add, tg_add(a, b))
BINARY(Sub, tg_sub(a, b))
BINARY(Mul, tg_mul(a, b))
BINARY(Equal, tg_eq(a, b))
BINARY(Less, tg_lt(a, b))
BINARY(Greater, tg_gt(a, b))
BINARY(LessOrEqual, tg_le(a, b))
BINARY(GreaterOrEqual, tg_ge(a, b))
BINARY(And, tg_bitwise_and(tg_cast(a, TG_BOOL), tg_cast(b, TG_BOOL)))
BINARY(Or, tg_bitwise_or(tg_cast(a, TG_BOOL), tg_cast(b, TG_BOOL)))
BINARY(Xor, tg_bitwise_xor(tg_cast(a, TG_BOOL), tg_cast(b, TG_BOOL)))
BINARY(BitwiseAnd, tg_bitwise_and(a, b))
BINARY(BitwiseOr, tg_bitwise_or(a, b))
BINARY(BitwiseXor, tg_bitwise_xor(a, b))
BINARY(PRelu, tg_where(tg_gt_s(a, 0), a, tg_mul(a, b)))
BINARY(Mod, ai(n, "fmod", 0) ? tg_fmod(a, b) : tg_mod(a, b))

static bool op_Div(Run *r, const Node *n) {
  tg_tensor a = IN(r, n, 0), b = IN(r, n, 1);
  if (is_intlike(tg_dtype_of(a)) && is_intlike(tg_dtype_of(b)))
    return out1(r, n, tg_div_mode(a, b, TG_DIV_TRUNC));
  return out1(r, n, tg_div(a, b));
}

/* ONNX Pow keeps the base's dtype */
static bool op_Pow(Run *r, const Node *n) {
  tg_tensor a = IN(r, n, 0), b = IN(r, n, 1);
  tg_dtype dt = tg_dtype_of(a);
  const Value *bv = &r->m->vals[n->in[1]];
  tg_tensor y;
  if (bv->kind == V_CONST && r->m->consts[bv->ref].has_scalar && r->m->consts[bv->ref].scalar == 2.0 &&
      !is_intlike(dt))
    y = tg_mul(a, a); /* x^2 exactly, as the decomposed LayerNorm's variance wants */
  else if (is_intlike(dt))
    y = tg_cast(tg_round(tg_pow(tg_cast(a, TG_FLOAT64), tg_cast(b, TG_FLOAT64))), dt);
  else
    y = tg_pow(a, tg_cast(b, dt));
  if (tg_valid(y) && tg_dtype_of(y) != dt) y = tg_cast(y, dt);
  return out1(r, n, y);
}

/* Sum, Mean, Max, Min: variadic with broadcasting */
static bool variadic(Run *r, const Node *n, tg_tensor (*f)(tg_tensor, tg_tensor)) {
  tg_tensor acc = IN(r, n, 0);
  for (int k = 1; k < n->nin && tg_valid(acc); k++) acc = f(acc, IN(r, n, k));
  return out1(r, n, acc);
}
static bool op_Sum(Run *r, const Node *n) { return variadic(r, n, tg_add); }
static bool op_Max(Run *r, const Node *n) { return variadic(r, n, tg_maximum); }
static bool op_Min(Run *r, const Node *n) { return variadic(r, n, tg_minimum); }
static bool op_Mean(Run *r, const Node *n) {
  if (!variadic(r, n, tg_add)) return false;
  return out1(r, n, tg_div_s(r->v[n->out[0]].t, (double)n->nin));
}

static bool op_Where(Run *r, const Node *n) {
  return out1(r, n, tg_where(IN(r, n, 0), IN(r, n, 1), IN(r, n, 2)));
}

static bool op_Cast(Run *r, const Node *n) {
  tg_dtype to = cast_target(n);
  if (!to)
    return op_fail(r, "Cast to data type %lld (%s) is not supported", (long long)ai(n, "to", 0),
                   onnx_dtype_name(ai(n, "to", 0)));
  return out1(r, n, tg_cast(IN(r, n, 0), to));
}
static bool op_CastLike(Run *r, const Node *n) {
  return out1(r, n, tg_cast(IN(r, n, 0), tg_dtype_of(IN(r, n, 1))));
}

static bool op_Clip(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  if (r->m->opset < 11 || (!has_in(n, 1) && !has_in(n, 2))) {
    if (!attr(n, "min") && !attr(n, "max")) return out1(r, n, x);
    return out1(r, n, tg_clamp(x, af(n, "min", -INFINITY), af(n, "max", INFINITY)));
  }
  tg_tensor lo = IN(r, n, 1), hi = IN(r, n, 2);
  if (lo.id) lo = tg_cast(lo, tg_dtype_of(x));
  if (hi.id) hi = tg_cast(hi, tg_dtype_of(x));
  return out1(r, n, tg_clamp_t(x, lo, hi));
}

/* ---- Softmax / LogSoftmax: opset < 13 flattens to 2-D at axis (default 1) ---- */
static bool softmax_like(Run *r, const Node *n, bool logsm) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", r->m->opset >= 13 ? -1 : 1);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  if (r->m->opset >= 13 || nd == 0)
    return out1(r, n, logsm ? tg_log_softmax(x, (int)axis) : tg_softmax(x, (int)axis));
  int64_t shape[ONNX_MAX_DIMS], two[2] = {1, 1};
  tg_shape(x, shape);
  for (int i = 0; i < nd; i++) two[i < axis ? 0 : 1] *= shape[i];
  tg_tensor y = tg_reshape(x, two, 2);
  y = logsm ? tg_log_softmax(y, 1) : tg_softmax(y, 1);
  return out1(r, n, tg_reshape(y, shape, nd));
}
static bool op_Softmax(Run *r, const Node *n) { return softmax_like(r, n, false); }
static bool op_LogSoftmax(Run *r, const Node *n) { return softmax_like(r, n, true); }

/* ---- reductions ---- */
/* axes from the attribute (older opsets) or input 1; *all set when reducing every axis, *noop when
 * the op is the identity (noop_with_empty_axes and no axes) */
static bool reduce_axes(Run *r, const Node *n, int nd, int *axes, int *naxes, bool *noop) {
  const I64s *a = aints(n, "axes");
  int64_t tmp[ONNX_MAX_DIMS];
  int cnt = 0;
  *noop = false;
  if (a) {
    if (a->n > (size_t)nd) return op_fail(r, "%zu axes for a %d-d tensor", a->n, nd);
    cnt = (int)a->n;
    for (int i = 0; i < cnt; i++) tmp[i] = a->v[i];
  } else if (has_in(n, 1)) {
    HostVal *h = HIN(r, n, 1, "axes");
    if (!h) return false;
    if (h->n > nd) return op_fail(r, "%lld axes for a %d-d tensor", (long long)h->n, nd);
    cnt = (int)h->n;
    for (int i = 0; i < cnt; i++) tmp[i] = h->v[i];
  }
  if (!cnt) {
    *noop = ai(n, "noop_with_empty_axes", 0) != 0;
    *naxes = nd;
    for (int i = 0; i < nd; i++) axes[i] = i;
    return true;
  }
  for (int i = 0; i < cnt; i++) {
    if (!norm_axis(r, &tmp[i], nd, "axis")) return false;
    for (int j = 0; j < i; j++)
      if (tmp[j] == tmp[i]) return op_fail(r, "axis %lld is given twice", (long long)tmp[i]);
    axes[i] = (int)tmp[i];
  }
  *naxes = cnt;
  return true;
}

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L1, R_L2, R_SUMSQ, R_LOGSUM, R_LOGSUMEXP };
static bool reduce(Run *r, const Node *n, int kind) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int axes[ONNX_MAX_DIMS], na = 0;
  bool noop = false, keep = ai(n, "keepdims", 1) != 0;
  if (!reduce_axes(r, n, nd, axes, &na, &noop)) return false;
  if (noop) return out1(r, n, x);
  if (na == 0) { /* a 0-d tensor: reducing it is the identity for these */
    if (kind == R_L1) return out1(r, n, tg_abs(x));
    if (kind == R_L2) return out1(r, n, tg_abs(x));
    if (kind == R_SUMSQ) return out1(r, n, tg_mul(x, x));
    if (kind == R_LOGSUM) return out1(r, n, tg_log(x));
    return out1(r, n, x);
  }
  tg_tensor y;
  switch (kind) {
  case R_SUM:
    y = tg_sum(x, axes, na, keep);
    break;
  case R_MEAN:
    y = tg_mean(x, axes, na, keep);
    break;
  case R_MAX:
    y = tg_max(x, axes, na, keep);
    break;
  case R_MIN:
    y = tg_min(x, axes, na, keep);
    break;
  case R_PROD:
    y = tg_prod(x, axes, na, keep);
    break;
  case R_L1:
    y = tg_sum(tg_abs(x), axes, na, keep);
    break;
  case R_L2:
    y = tg_sqrt(tg_sum(tg_mul(x, x), axes, na, keep));
    break;
  case R_SUMSQ:
    y = tg_sum(tg_mul(x, x), axes, na, keep);
    break;
  case R_LOGSUM:
    y = tg_log(tg_sum(x, axes, na, keep));
    break;
  default:
    y = tg_logsumexp(x, axes, na, keep);
    break;
  }
  if (tg_valid(y) && kind != R_MEAN && tg_dtype_of(y) != tg_dtype_of(x)) y = tg_cast(y, tg_dtype_of(x));
  return out1(r, n, y);
}
#define REDUCE(NAME, K)                                                                                      \
  static bool op_##NAME(Run *r, const Node *n) { return reduce(r, n, K); }
REDUCE(ReduceSum, R_SUM)
REDUCE(ReduceMean, R_MEAN)
REDUCE(ReduceMax, R_MAX)
REDUCE(ReduceMin, R_MIN)
REDUCE(ReduceProd, R_PROD)
REDUCE(ReduceL1, R_L1)
REDUCE(ReduceL2, R_L2)
REDUCE(ReduceSumSquare, R_SUMSQ)
REDUCE(ReduceLogSum, R_LOGSUM)
REDUCE(ReduceLogSumExp, R_LOGSUMEXP)

static bool argext(Run *r, const Node *n, bool mx) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", 0);
  bool keep = ai(n, "keepdims", 1) != 0;
  if (nd == 0)
    return out1(
        r, n,
        tg_zeros(NULL, 0, &(tg_opts){.dtype = TG_INT64, .device = r->m->device, .requires_grad = false}));
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  int ax = (int)axis;
  if (ai(n, "select_last_index", 0)) {
    int64_t last = tg_dim(x, ax) - 1;
    tg_tensor fi =
        mx ? tg_argmax(tg_flip(x, &ax, 1), &ax, 1, keep) : tg_argmin(tg_flip(x, &ax, 1), &ax, 1, keep);
    return out1(r, n, tg_rsub_s((double)last, tg_cast(fi, TG_INT64)));
  }
  tg_tensor y = mx ? tg_argmax(x, &ax, 1, keep) : tg_argmin(x, &ax, 1, keep);
  return out1(r, n, tg_cast(y, TG_INT64));
}
static bool op_ArgMax(Run *r, const Node *n) { return argext(r, n, true); }
static bool op_ArgMin(Run *r, const Node *n) { return argext(r, n, false); }

/* ==== movement ops ============================================================================= */

static bool axes_arg(Run *r, const Node *n, int k, int64_t *axes, int *na, bool *given) {
  const I64s *a = aints(n, "axes");
  *given = true;
  if (a) {
    if (a->n > ONNX_MAX_DIMS) return op_fail(r, "%zu axes (at most %d)", a->n, ONNX_MAX_DIMS);
    *na = (int)a->n;
    for (int i = 0; i < *na; i++) axes[i] = a->v[i];
    return true;
  }
  if (has_in(n, k)) {
    HostVal *h = HIN(r, n, k, "axes");
    if (!h) return false;
    if (h->n > ONNX_MAX_DIMS) return op_fail(r, "%lld axes (at most %d)", (long long)h->n, ONNX_MAX_DIMS);
    *na = (int)h->n;
    for (int i = 0; i < *na; i++) axes[i] = h->v[i];
    return true;
  }
  *given = false;
  *na = 0;
  return true;
}

static bool reshape_target(Run *r, const Node *n, const int64_t *in, int nd, int64_t *out, int *ond) {
  int64_t numel = 1;
  for (int i = 0; i < nd; i++)
    if (__builtin_mul_overflow(numel, in[i], &numel))
      return op_fail(r, "the input's element count overflows");
  const I64s *sa = aints(n, "shape");
  HostVal *h = NULL;
  if (!sa && !(h = HIN(r, n, 1, "shape"))) return false;
  int64_t cnt = sa ? (int64_t)sa->n : h->n;
  if (cnt > ONNX_MAX_DIMS)
    return op_fail(r, "target shape has %lld dims (at most %d)", (long long)cnt, ONNX_MAX_DIMS);
  bool allowzero = ai(n, "allowzero", 0) != 0;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < cnt; i++) {
    int64_t d = sa ? sa->v[i] : h->v[i];
    if (d == 0 && !allowzero) {
      if (i >= nd)
        return op_fail(r, "target shape entry %d is 0 (copy the input's dim) but the input has %d dims", i,
                       nd);
      d = in[i];
    }
    if (d == -1) {
      if (infer >= 0) return op_fail(r, "target shape has more than one -1");
      infer = i;
    } else if (d < 0)
      return op_fail(r, "target shape entry %d is %lld", i, (long long)d);
    else if (__builtin_mul_overflow(known, d, &known))
      return op_fail(r, "the target shape's element count overflows");
    out[i] = d;
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return op_fail(r, "cannot infer the -1 dim: %lld elements into parts of %lld", (long long)numel,
                     (long long)known);
    out[infer] = numel / known;
  } else if (known != numel)
    return op_fail(r, "cannot reshape %lld elements into %lld", (long long)numel, (long long)known);
  *ond = (int)cnt;
  return true;
}

static int fold_Reshape(Run *r, const Node *n) {
  if (!r->v[n->in[0]].h) return 0;
  const HostVal *x = r->v[n->in[0]].h;
  int64_t shape[ONNX_MAX_DIMS];
  int nd;
  if (!reshape_target(r, n, x->shape, x->ndim, shape, &nd)) return -1;
  return fold_reshaped(r, n, x, shape, nd);
}
static bool op_Reshape(Run *r, const Node *n) {
  int64_t in[ONNX_MAX_DIMS], shape[ONNX_MAX_DIMS];
  int ind = in_shape(r, n, 0, in), nd;
  if (ind < 0 || !reshape_target(r, n, in, ind, shape, &nd)) return false;
  return out1(r, n, tg_reshape(IN(r, n, 0), shape, nd));
}

static bool flatten_shape(Run *r, const Node *n, const int64_t *in, int nd, int64_t *two) {
  int64_t axis = ai(n, "axis", 1);
  if (axis < -nd || axis > nd)
    return op_fail(r, "axis %lld is out of range for a %d-d tensor", (long long)axis, nd);
  if (axis < 0) axis += nd;
  two[0] = two[1] = 1;
  for (int i = 0; i < nd; i++) two[i < axis ? 0 : 1] *= in[i];
  return true;
}
static int fold_Flatten(Run *r, const Node *n) {
  const HostVal *x = r->v[n->in[0]].h;
  int64_t two[2];
  if (!x) return 0;
  if (!flatten_shape(r, n, x->shape, x->ndim, two)) return -1;
  return fold_reshaped(r, n, x, two, 2);
}
static bool op_Flatten(Run *r, const Node *n) {
  int64_t in[ONNX_MAX_DIMS], two[2];
  int nd = in_shape(r, n, 0, in);
  if (nd < 0 || !flatten_shape(r, n, in, nd, two)) return false;
  return out1(r, n, tg_reshape(IN(r, n, 0), two, 2));
}

static bool op_Transpose(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int perm[ONNX_MAX_DIMS];
  const I64s *p = aints(n, "perm");
  if (p && p->n != (size_t)nd) return op_fail(r, "perm has %zu entries for a %d-d tensor", p->n, nd);
  for (int i = 0; i < nd; i++) {
    int64_t v = p ? p->v[i] : nd - 1 - i;
    if (v < -nd || v >= nd) return op_fail(r, "perm entry %lld is out of range", (long long)v);
    perm[i] = (int)(v < 0 ? v + nd : v);
  }
  return out1(r, n, tg_permute(x, perm, nd));
}

/* Squeeze / Unsqueeze: the output shape */
static bool squeeze_shape(Run *r, const Node *n, const int64_t *in, int nd, int64_t *out, int *ond,
                          bool unsq) {
  int64_t axes[ONNX_MAX_DIMS];
  int na = 0;
  bool given = false;
  if (!axes_arg(r, n, 1, axes, &na, &given)) return false;
  if (unsq) {
    if (!given) return op_fail(r, "Unsqueeze needs axes");
    int od = nd + na;
    if (od > ONNX_MAX_DIMS) return op_fail(r, "result would have %d dims (at most %d)", od, ONNX_MAX_DIMS);
    bool mark[ONNX_MAX_DIMS] = {0};
    for (int i = 0; i < na; i++) {
      if (!norm_axis(r, &axes[i], od, "axis")) return false;
      if (mark[axes[i]]) return op_fail(r, "axis %lld is given twice", (long long)axes[i]);
      mark[axes[i]] = true;
    }
    for (int i = 0, j = 0; i < od; i++) out[i] = mark[i] ? 1 : in[j++];
    *ond = od;
    return true;
  }
  bool mark[ONNX_MAX_DIMS] = {0};
  for (int i = 0; i < na; i++) {
    if (!norm_axis(r, &axes[i], nd, "axis")) return false;
    if (in[axes[i]] != 1)
      return op_fail(r, "cannot squeeze axis %lld of size %lld", (long long)axes[i], (long long)in[axes[i]]);
    mark[axes[i]] = true;
  }
  int od = 0;
  for (int i = 0; i < nd; i++)
    if (!(given ? mark[i] : in[i] == 1)) out[od++] = in[i];
  *ond = od;
  return true;
}
static int fold_squeeze(Run *r, const Node *n, bool unsq) {
  const HostVal *x = r->v[n->in[0]].h;
  if (!x) return 0;
  int64_t shape[ONNX_MAX_DIMS];
  int nd;
  if (!squeeze_shape(r, n, x->shape, x->ndim, shape, &nd, unsq)) return -1;
  return fold_reshaped(r, n, x, shape, nd);
}
static bool op_squeeze(Run *r, const Node *n, bool unsq) {
  int64_t in[ONNX_MAX_DIMS], shape[ONNX_MAX_DIMS];
  int ind = in_shape(r, n, 0, in), nd;
  if (ind < 0 || !squeeze_shape(r, n, in, ind, shape, &nd, unsq)) return false;
  return out1(r, n, tg_reshape(IN(r, n, 0), shape, nd));
}
static int fold_Squeeze(Run *r, const Node *n) { return fold_squeeze(r, n, false); }
static int fold_Unsqueeze(Run *r, const Node *n) { return fold_squeeze(r, n, true); }
static bool op_Squeeze(Run *r, const Node *n) { return op_squeeze(r, n, false); }
static bool op_Unsqueeze(Run *r, const Node *n) { return op_squeeze(r, n, true); }

static bool expand_shape(Run *r, const Node *n, const int64_t *in, int nd, int64_t *out, int *ond) {
  HostVal *h = HIN(r, n, 1, "shape");
  if (!h) return false;
  if (h->n > ONNX_MAX_DIMS)
    return op_fail(r, "shape has %lld dims (at most %d)", (long long)h->n, ONNX_MAX_DIMS);
  int od = (int)h->n > nd ? (int)h->n : nd;
  for (int i = 0; i < od; i++) {
    int a = i - (od - nd), b = i - (od - (int)h->n);
    int64_t da = a >= 0 ? in[a] : 1, db = b >= 0 ? h->v[b] : 1;
    if (da != db && da != 1 && db != 1)
      return op_fail(r, "cannot expand dim %d of size %lld to %lld", a, (long long)da, (long long)db);
    out[i] = da == 1 ? db : da;
    if (db < 0) return op_fail(r, "shape entry %lld is negative", (long long)db);
  }
  *ond = od;
  return true;
}
static bool op_Expand(Run *r, const Node *n) {
  int64_t in[ONNX_MAX_DIMS], shape[ONNX_MAX_DIMS], full[ONNX_MAX_DIMS];
  int ind = in_shape(r, n, 0, in), nd;
  if (ind < 0 || !expand_shape(r, n, in, ind, shape, &nd)) return false;
  for (int i = 0; i < nd; i++) full[i] = i < nd - ind ? 1 : in[i - (nd - ind)];
  tg_tensor x = tg_reshape(IN(r, n, 0), full, nd);
  return out1(r, n, tg_expand(x, shape, nd));
}
static int fold_Expand(Run *r, const Node *n) {
  if (!all_host(r, n, 2)) return 0;
  const HostVal *x = r->v[n->in[0]].h;
  int64_t shape[ONNX_MAX_DIMS];
  int nd;
  if (!expand_shape(r, n, x->shape, x->ndim, shape, &nd)) return -1;
  HostVal *tgt = host_new(TG_INT64, shape, nd);
  if (!tgt) return op_fail(r, "out of memory"), -1;
  const HostVal *in[2] = {x, tgt};
  int rc = host_map(r, n, in, 2, x->dt, hf_id);
  host_free(tgt);
  return rc;
}

static int fold_Concat(Run *r, const Node *n) {
  if (!all_host(r, n, n->nin)) return 0;
  const HostVal *a = r->v[n->in[0]].h;
  int nd = a->ndim;
  int64_t axis = ai(n, "axis", 0);
  if (!norm_axis(r, &axis, nd, "axis")) return -1;
  int64_t shape[ONNX_MAX_DIMS];
  memcpy(shape, a->shape, sizeof shape);
  shape[axis] = 0;
  tg_dtype dt = a->dt;
  for (int k = 0; k < n->nin; k++) {
    const HostVal *b = n->in[k] >= 0 ? r->v[n->in[k]].h : NULL;
    if (!b || b->ndim != nd) return 0;
    for (int d = 0; d < nd; d++)
      if (d != axis && b->shape[d] != a->shape[d]) return 0;
    shape[axis] += b->shape[axis];
    dt = tg_dtype_promote(dt, b->dt);
  }
  HostVal *o = host_new(dt, shape, nd);
  if (!o) return op_fail(r, "out of memory"), -1;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= shape[d];
  for (int d = (int)axis + 1; d < nd; d++) inner *= shape[d];
  int64_t pos = 0;
  for (int64_t i = 0; i < outer; i++)
    for (int k = 0; k < n->nin; k++) {
      const HostVal *b = r->v[n->in[k]].h;
      int64_t blk = b->shape[axis] * inner;
      memcpy(o->v + pos, b->v + i * blk, (size_t)blk * sizeof *o->v);
      pos += blk;
    }
  set_host(r, n, 0, o);
  return 1;
}
static bool op_Concat(Run *r, const Node *n) {
  tg_tensor *ts = malloc((size_t)n->nin * sizeof *ts);
  if (!ts) return op_fail(r, "out of memory");
  int cnt = 0;
  for (int k = 0; k < n->nin; k++)
    if (has_in(n, k)) ts[cnt++] = IN(r, n, k);
  int64_t axis = ai(n, "axis", 0);
  int nd = rank(ts[0]);
  bool ok = nd >= 0 && norm_axis(r, &axis, nd, "axis");
  ok = ok && out1(r, n, tg_cat(ts, cnt, (int)axis));
  free(ts);
  return ok;
}

static bool op_Split(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", 0);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  int64_t dim = tg_dim(x, (int)axis);
  int64_t *sizes = malloc((size_t)(n->nout + 1) * sizeof *sizes);
  tg_tensor *outs = malloc((size_t)(n->nout + 1) * sizeof *outs);
  bool ok = sizes && outs;
  if (!ok) op_fail(r, "out of memory");
  int cnt = n->nout;
  const I64s *sa = aints(n, "split");
  if (ok && (sa || has_in(n, 1))) {
    HostVal *h = sa ? NULL : HIN(r, n, 1, "split");
    int64_t c = sa ? (int64_t)sa->n : h ? h->n : -1;
    if (c < 0)
      ok = false;
    else if (c != n->nout)
      ok = op_fail(r, "split has %lld sizes for %d outputs", (long long)c, n->nout);
    for (int i = 0; ok && i < cnt; i++) sizes[i] = sa ? sa->v[i] : h->v[i];
  } else if (ok) {
    int64_t parts = ai(n, "num_outputs", n->nout);
    if (parts != n->nout || parts <= 0)
      ok = op_fail(r, "num_outputs %lld for %d outputs", (long long)parts, n->nout);
    int64_t each = parts > 0 ? (dim + parts - 1) / parts : 0;
    for (int i = 0; ok && i < cnt; i++) {
      int64_t left = dim - each * i;
      sizes[i] = left < 0 ? 0 : left < each ? left : each;
    }
  }
  if (ok) ok = tg_split(x, sizes, cnt, (int)axis, outs, cnt) == cnt;
  for (int i = 0; ok && i < cnt; i++) set_out(r, n, i, outs[i]);
  free(sizes);
  free(outs);
  return ok;
}

/* Slice: per-dim start, step and count after ONNX's clamping rules */
static bool slice_params(Run *r, const Node *n, const int64_t *shape, int nd, int64_t *start, int64_t *step,
                         int64_t *count) {
  for (int d = 0; d < nd; d++) start[d] = 0, step[d] = 1, count[d] = shape[d];
  const I64s *as_ = aints(n, "starts"), *ae = aints(n, "ends");
  HostVal *hs = NULL, *he = NULL, *ha = NULL, *hp = NULL;
  int64_t cnt;
  if (as_ || ae) { /* opset < 10 */
    if (!as_ || !ae || as_->n != ae->n) return op_fail(r, "starts and ends must have the same length");
    cnt = (int64_t)as_->n;
  } else {
    if (!(hs = HIN(r, n, 1, "starts")) || !(he = HIN(r, n, 2, "ends"))) return false;
    if (hs->n != he->n)
      return op_fail(r, "starts has %lld entries, ends %lld", (long long)hs->n, (long long)he->n);
    cnt = hs->n;
    if (has_in(n, 3) && !(ha = HIN(r, n, 3, "axes"))) return false;
    if (has_in(n, 4) && !(hp = HIN(r, n, 4, "steps"))) return false;
    if ((ha && ha->n != cnt) || (hp && hp->n != cnt))
      return op_fail(r, "axes/steps must have as many entries as starts");
  }
  const I64s *aa = aints(n, "axes");
  if (aa && (int64_t)aa->n != cnt) return op_fail(r, "axes must have as many entries as starts");
  if (cnt > nd) return op_fail(r, "%lld slice entries for a %d-d tensor", (long long)cnt, nd);
  bool seen[ONNX_MAX_DIMS] = {0};
  for (int64_t i = 0; i < cnt; i++) {
    int64_t ax = ha ? ha->v[i] : aa ? aa->v[i] : i;
    if (!norm_axis(r, &ax, nd, "axis")) return false;
    if (seen[ax]) return op_fail(r, "axis %lld is sliced twice", (long long)ax);
    seen[ax] = true;
    int64_t s = as_ ? as_->v[i] : hs->v[i], e = ae ? ae->v[i] : he->v[i], st = hp ? hp->v[i] : 1,
            dim = shape[ax];
    if (st == 0) return op_fail(r, "slice step is 0");
    if (st == INT64_MIN) st = -INT64_MAX;
    if (s < 0) s = s < -dim ? 0 : s + dim;
    if (e < 0) e = e < -dim ? -1 : e + dim;
    int64_t c;
    if (st > 0) {
      s = s > dim ? dim : s;
      e = e < 0 ? 0 : e > dim ? dim : e;
      c = e > s ? (e - s - 1) / st + 1 : 0;
    } else {
      s = s > dim - 1 ? dim - 1 : s;
      e = e > dim - 1 ? dim - 1 : e;
      if (s < 0)
        c = 0;
      else
        c = s > e ? (s - e - 1) / (-st) + 1 : 0;
    }
    start[ax] = c ? s : 0;
    step[ax] = st;
    count[ax] = c;
  }
  return true;
}
static int fold_Slice(Run *r, const Node *n) {
  const HostVal *x = r->v[n->in[0]].h;
  if (!x) return 0;
  int64_t start[ONNX_MAX_DIMS], step[ONNX_MAX_DIMS], count[ONNX_MAX_DIMS];
  if (!slice_params(r, n, x->shape, x->ndim, start, step, count)) return -1;
  HostVal *o = host_new(x->dt, count, x->ndim);
  if (!o) return op_fail(r, "out of memory"), -1;
  for (int64_t i = 0; i < o->n; i++) {
    int64_t rem = i, off = 0, mul = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      int64_t idx = rem % count[d];
      rem /= count[d];
      off += (start[d] + idx * step[d]) * mul;
      mul *= x->shape[d];
    }
    o->v[i] = x->v[off];
  }
  set_host(r, n, 0, o);
  return 1;
}
static bool op_Slice(Run *r, const Node *n) {
  int64_t shape[ONNX_MAX_DIMS], start[ONNX_MAX_DIMS], step[ONNX_MAX_DIMS], count[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, shape);
  if (nd < 0 || !slice_params(r, n, shape, nd, start, step, count)) return false;
  tg_index_spec spec[ONNX_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    if (count[d] == 0)
      spec[d] = TG_IX_SLICE(0, 0, 1);
    else if (step[d] > 0)
      spec[d] = TG_IX_SLICE(start[d], start[d] + (count[d] - 1) * step[d] + 1, step[d]);
    else {
      int64_t stop = start[d] + (count[d] - 1) * step[d] - 1;
      spec[d] = stop < 0 ? TG_IX_FROM(start[d], step[d]) : TG_IX_SLICE(start[d], stop, step[d]);
    }
  }
  return out1(r, n, nd ? tg_getitem(IN(r, n, 0), spec, nd) : IN(r, n, 0));
}

static int fold_Gather(Run *r, const Node *n) {
  if (!all_host(r, n, 2)) return 0;
  const HostVal *x = r->v[n->in[0]].h, *ix = r->v[n->in[1]].h;
  int64_t axis = ai(n, "axis", 0);
  if (!norm_axis(r, &axis, x->ndim, "axis")) return -1;
  int od = x->ndim - 1 + ix->ndim;
  if (od > ONNX_MAX_DIMS) return 0;
  int64_t shape[ONNX_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < axis; d++) shape[k++] = x->shape[d];
  for (int d = 0; d < ix->ndim; d++) shape[k++] = ix->shape[d];
  for (int d = (int)axis + 1; d < x->ndim; d++) shape[k++] = x->shape[d];
  int64_t outer = 1, inner = 1, dim = x->shape[axis];
  for (int d = 0; d < axis; d++) outer *= x->shape[d];
  for (int d = (int)axis + 1; d < x->ndim; d++) inner *= x->shape[d];
  if (outer * ix->n * inner > ONNX_HOST_MAX) return 0;
  HostVal *o = host_new(x->dt, shape, od);
  if (!o) return op_fail(r, "out of memory"), -1;
  int64_t pos = 0;
  for (int64_t i = 0; i < outer; i++)
    for (int64_t j = 0; j < ix->n; j++) {
      int64_t idx = ix->v[j] < 0 ? ix->v[j] + dim : ix->v[j];
      if (idx < 0 || idx >= dim) {
        host_free(o);
        return op_fail(r, "index %lld is out of range for a dim of size %lld", (long long)ix->v[j],
                       (long long)dim),
               -1;
      }
      for (int64_t q = 0; q < inner; q++) o->v[pos++] = x->v[(i * dim + idx) * inner + q];
    }
  set_host(r, n, 0, o);
  return 1;
}
static bool op_Gather(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", 0);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  int64_t xs[ONNX_MAX_DIMS];
  tg_shape(x, xs);
  RV *iv = &r->v[n->in[1]];
  if (iv->h && iv->h->n <= ONNX_GATHER_SHRINK &&
      iv->h->n > 0) { /* constant indices: views, no data-dependent load */
    const HostVal *ix = iv->h;
    tg_tensor parts[ONNX_GATHER_SHRINK];
    int64_t b[2 * ONNX_MAX_DIMS];
    for (int64_t j = 0; j < ix->n; j++) {
      int64_t idx = ix->v[j] < 0 ? ix->v[j] + xs[axis] : ix->v[j];
      if (idx < 0 || idx >= xs[axis])
        return op_fail(r, "index %lld is out of range for a dim of size %lld", (long long)ix->v[j],
                       (long long)xs[axis]);
      for (int d = 0; d < nd; d++) b[2 * d] = d == axis ? idx : 0, b[2 * d + 1] = d == axis ? idx + 1 : xs[d];
      parts[j] = tg_shrink(x, b, 2 * nd);
    }
    tg_tensor y = ix->n == 1 ? parts[0] : tg_cat(parts, (int)ix->n, (int)axis);
    int64_t shape[ONNX_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < axis; d++) shape[k++] = xs[d];
    for (int d = 0; d < ix->ndim; d++) shape[k++] = ix->shape[d];
    for (int d = (int)axis + 1; d < nd; d++) shape[k++] = xs[d];
    return out1(r, n, tg_reshape(y, shape, k));
  }
  tg_tensor idx = IN(r, n, 1);
  int q = rank(idx);
  if (q < 0) return false;
  if (nd - 1 + q > ONNX_MAX_DIMS) return op_fail(r, "result would have %d dims", nd - 1 + q);
  int perm[ONNX_MAX_DIMS];
  perm[0] = (int)axis;
  for (int d = 0, k = 1; d < nd; d++)
    if (d != axis) perm[k++] = d;
  tg_tensor xp = axis ? tg_permute(x, perm, nd) : x;
  tg_tensor y = tg_index(xp, idx); /* idx.shape + the other dims */
  if (!axis || !tg_valid(y)) return out1(r, n, y);
  int od = nd - 1 + q, back[ONNX_MAX_DIMS], k = 0;
  for (int d = 0; d < axis; d++) back[k++] = q + d;
  for (int d = 0; d < q; d++) back[k++] = d;
  for (int d = (int)axis; d < nd - 1; d++) back[k++] = q + d;
  return out1(r, n, tg_permute(y, back, od));
}

static bool op_GatherElements(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), idx = IN(r, n, 1);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", 0);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  idx = tg_where(tg_lt_s(idx, 0), tg_add_s(idx, (double)tg_dim(x, (int)axis)), idx);
  return out1(r, n, tg_gather(x, (int)axis, idx));
}

static bool op_Tile(Run *r, const Node *n) {
  HostVal *h = HIN(r, n, 1, "repeats");
  if (!h) return false;
  tg_tensor x = IN(r, n, 0);
  if (h->n != rank(x))
    return op_fail(r, "repeats has %lld entries for a %d-d tensor", (long long)h->n, rank(x));
  return out1(r, n, tg_repeat(x, h->v, (int)h->n));
}

static bool op_Pad(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  const I64s *pa = aints(n, "pads");
  if (!pa) pa = aints(n, "paddings");
  HostVal *hp = NULL;
  if (!pa && !(hp = HIN(r, n, 1, "pads"))) return false;
  int64_t np = pa ? (int64_t)pa->n : hp->n;
  const int64_t *pv = pa ? pa->v : hp->v;
  int64_t axes[ONNX_MAX_DIMS];
  int na = nd;
  for (int i = 0; i < nd; i++) axes[i] = i;
  if (has_in(n, 3)) {
    HostVal *ha = HIN(r, n, 3, "axes");
    if (!ha) return false;
    if (ha->n > nd) return op_fail(r, "%lld axes for a %d-d tensor", (long long)ha->n, nd);
    na = (int)ha->n;
    for (int i = 0; i < na; i++) {
      axes[i] = ha->v[i];
      if (!norm_axis(r, &axes[i], nd, "axis")) return false;
    }
  }
  if (np != 2 * na) return op_fail(r, "pads has %lld entries for %d axes (2 per axis)", (long long)np, na);
  int64_t pads[2 * ONNX_MAX_DIMS] = {0};
  for (int i = 0; i < na; i++) pads[2 * axes[i]] = pv[i], pads[2 * axes[i] + 1] = pv[i + na];
  double value = af(n, "value", 0.0);
  if (has_in(n, 2) && !scalar_in(r, n, 2, &value)) return false;
  const char *mode = as(n, "mode", "constant");
  tg_padding_mode pm;
  if (!strcmp(mode, "constant"))
    pm = TG_PAD_CONSTANT;
  else if (!strcmp(mode, "reflect"))
    pm = TG_PAD_REFLECT;
  else if (!strcmp(mode, "edge"))
    pm = TG_PAD_REPLICATE;
  else if (!strcmp(mode, "wrap"))
    pm = TG_PAD_CIRCULAR;
  else
    return op_fail(r, "pad mode '%s' is not supported (constant, reflect, edge, wrap)", mode);
  if (pm == TG_PAD_CONSTANT) {
    tg_tensor y = tg_pad(x, pads, 2 * nd, value);
    if (tg_valid(y) && tg_dtype_of(y) != tg_dtype_of(x)) y = tg_cast(y, tg_dtype_of(x));
    return out1(r, n, y);
  }
  /* (a constant_value given with another mode is ignored, as ONNX says) */
  return out1(r, n, tg_pad_mode(x, pads, 2 * nd, pm, pm == TG_PAD_CONSTANT ? value : 0.0));
}

static int fold_ConstantOfShape(Run *r, const Node *n) {
  const Attr *a = attr(n, "value");
  const Const *c = a && a->t >= 0 ? &r->m->consts[a->t] : NULL;
  if (!c || !c->h || !all_host(r, n, 1)) return 0;
  const HostVal *s = r->v[n->in[0]].h;
  if (s->ndim != 1 || s->n > ONNX_MAX_DIMS) return 0;
  int64_t numel = 1;
  for (int i = 0; i < s->n; i++) {
    if (s->v[i] < 0 || (s->v[i] && numel > ONNX_HOST_MAX / s->v[i] + 1)) return 0;
    numel *= s->v[i];
  }
  if (numel > ONNX_HOST_MAX) return 0;
  HostVal *o = host_new(c->dt, s->v, (int)s->n);
  if (!o) return op_fail(r, "out of memory"), -1;
  for (int64_t i = 0; i < o->n; i++) o->v[i] = c->h->v[0];
  set_host(r, n, 0, o);
  return 1;
}
static bool op_ConstantOfShape(Run *r, const Node *n) {
  HostVal *s = HIN(r, n, 0, "shape");
  if (!s) return false;
  if (s->ndim > 1 || s->n > ONNX_MAX_DIMS)
    return op_fail(r, "shape must be a 1-d tensor of at most %d dims", ONNX_MAX_DIMS);
  for (int64_t i = 0; i < s->n; i++)
    if (s->v[i] < 0) return op_fail(r, "shape entry %lld is negative", (long long)s->v[i]);
  const Attr *a = attr(n, "value");
  const Const *c = a && a->t >= 0 ? &r->m->consts[a->t] : NULL;
  if (c && tg_numel(c->t) != 1) return op_fail(r, "value must have one element");
  if (!c || c->has_scalar)
    return out1(
        r, n,
        tg_full(s->v, (int)s->n, c ? c->scalar : 0.0,
                &(tg_opts){.dtype = c ? c->dt : TG_FLOAT32, .device = r->m->device, .requires_grad = false}));
  int64_t ones[ONNX_MAX_DIMS];
  for (int i = 0; i < s->n; i++) ones[i] = 1;
  return out1(r, n, tg_contiguous(tg_expand(tg_reshape(c->t, ones, (int)s->n), s->v, (int)s->n)));
}

static int fold_Range(Run *r, const Node *n) {
  if (!all_host(r, n, 3)) return 0;
  const HostVal *a = r->v[n->in[0]].h, *b = r->v[n->in[1]].h, *d = r->v[n->in[2]].h;
  if (a->n != 1 || b->n != 1 || d->n != 1 || d->v[0] == 0) return 0;
  /* ceil((limit - start) / delta) in exact integers (doubles round past 2^53) */
  __int128 diff = (__int128)b->v[0] - a->v[0], dd = d->v[0], q = diff / dd;
  if (diff % dd != 0 && (diff > 0) == (dd > 0)) q++;
  if (q > ONNX_HOST_MAX) return 0;
  int64_t len = q < 0 ? 0 : (int64_t)q;
  HostVal *o = host_new(a->dt, &len, 1);
  if (!o) return op_fail(r, "out of memory"), -1;
  for (int64_t i = 0; i < len; i++) o->v[i] = (int64_t)((uint64_t)a->v[0] + (uint64_t)i * (uint64_t)d->v[0]);
  set_host(r, n, 0, o);
  return 1;
}
static bool op_Range(Run *r, const Node *n) {
  double s, l, d;
  if (!scalar_in(r, n, 0, &s) || !scalar_in(r, n, 1, &l) || !scalar_in(r, n, 2, &d)) return false;
  if (d == 0) return op_fail(r, "delta is 0");
  tg_dtype dt = tg_dtype_of(IN(r, n, 0));
  if ((l - s) / d <= 0)
    return out1(
        r, n,
        tg_empty((int64_t[]){0}, 1, &(tg_opts){.dtype = dt, .device = r->m->device, .requires_grad = false}));
  return out1(r, n,
              tg_arange(s, l, d, &(tg_opts){.dtype = dt, .device = r->m->device, .requires_grad = false}));
}

/* ==== neural-network ops ======================================================================== */

static bool op_MatMul(Run *r, const Node *n) {
  tg_tensor a = IN(r, n, 0), b = IN(r, n, 1);
  int na = rank(a), nb = rank(b);
  if (na < 0 || nb < 0) return false;
  if (na == 0 || nb == 0) return op_fail(r, "MatMul of a 0-d tensor");
  bool sa = na == 1, sb = nb == 1;
  if (sa) a = tg_unsqueeze(a, 0);
  if (sb) b = tg_unsqueeze(b, 1);
  tg_tensor y = tg_matmul(a, b);
  if (sb) y = tg_squeeze(y, -1);
  if (sa) y = tg_squeeze(y, -2 + (sb ? 1 : 0));
  return out1(r, n, y);
}

static bool op_Gemm(Run *r, const Node *n) {
  tg_tensor a = IN(r, n, 0), b = IN(r, n, 1);
  if (rank(a) != 2 || rank(b) != 2)
    return op_fail(r, "Gemm needs 2-d A and B, got %d-d and %d-d", rank(a), rank(b));
  if (ai(n, "transA", 0)) a = tg_transpose(a, 0, 1);
  if (ai(n, "transB", 0)) b = tg_transpose(b, 0, 1);
  double alpha = af(n, "alpha", 1.0), beta = af(n, "beta", 1.0);
  tg_tensor y = tg_matmul(a, b);
  if (alpha != 1.0) y = tg_mul_s(y, alpha);
  if (has_in(n, 2) && beta != 0.0) {
    tg_tensor c = IN(r, n, 2);
    y = tg_add(y, beta != 1.0 ? tg_mul_s(c, beta) : c);
  }
  return out1(r, n, y);
}

/* kernel geometry shared by Conv, ConvTranspose and the pools: fills the per-dim arrays (first spatial
 * dim first) and the padding in tg_window_opts order (pairs from the last dim back) */
typedef struct {
  int nk;
  int64_t k[TG_WINDOW_MAXDIMS], s[TG_WINDOW_MAXDIMS], d[TG_WINDOW_MAXDIMS], pb[TG_WINDOW_MAXDIMS],
      pe[TG_WINDOW_MAXDIMS];
  const char *auto_pad;
} Geo;

static bool per_dim(Run *r, const Node *n, const char *name, int nk, int64_t def, int64_t *out) {
  const I64s *a = aints(n, name);
  for (int i = 0; i < nk; i++) out[i] = def;
  if (!a) return true;
  if (a->n != (size_t)nk) return op_fail(r, "%s has %zu entries for %d spatial dims", name, a->n, nk);
  for (int i = 0; i < nk; i++) {
    if (a->v[i] < 1 || a->v[i] > ONNX_MAX_WINDOW)
      return op_fail(r, "%s entry %lld must be between 1 and %lld", name, (long long)a->v[i],
                     (long long)ONNX_MAX_WINDOW);
    out[i] = a->v[i];
  }
  return true;
}

static bool geometry(Run *r, const Node *n, const int64_t *xs, int nk, const int64_t *kernel, Geo *g,
                     bool transpose) {
  g->nk = nk;
  if (nk < 1 || nk > TG_WINDOW_MAXDIMS)
    return op_fail(r, "%d spatial dims (1 to %d are supported)", nk, TG_WINDOW_MAXDIMS);
  const I64s *ks = aints(n, "kernel_shape");
  if (ks && ks->n != (size_t)nk)
    return op_fail(r, "kernel_shape has %zu entries for %d spatial dims", ks->n, nk);
  for (int i = 0; i < nk; i++) {
    g->k[i] = kernel ? kernel[i] : ks ? ks->v[i] : 0;
    if (kernel && ks && ks->v[i] != kernel[i])
      return op_fail(r, "kernel_shape %lld differs from the weight's %lld", (long long)ks->v[i],
                     (long long)kernel[i]);
    if (g->k[i] < 1 || g->k[i] > ONNX_MAX_WINDOW)
      return op_fail(r, "kernel size %lld is out of range", (long long)g->k[i]);
  }
  if (!per_dim(r, n, "strides", nk, 1, g->s) || !per_dim(r, n, "dilations", nk, 1, g->d)) return false;
  const I64s *p = aints(n, "pads");
  if (p && p->n != (size_t)(2 * nk))
    return op_fail(r, "pads has %zu entries for %d spatial dims (2 per dim)", p->n, nk);
  for (int i = 0; i < nk; i++) {
    g->pb[i] = p ? p->v[i] : 0;
    g->pe[i] = p ? p->v[i + nk] : 0;
    if (g->pb[i] < 0 || g->pe[i] < 0) return op_fail(r, "negative pads are not supported");
    if (g->pb[i] > ONNX_MAX_WINDOW || g->pe[i] > ONNX_MAX_WINDOW)
      return op_fail(r, "pads larger than %lld", (long long)ONNX_MAX_WINDOW);
  }
  g->auto_pad = as(n, "auto_pad", "NOTSET");
  if (!strcmp(g->auto_pad, "VALID")) {
    for (int i = 0; i < nk; i++) g->pb[i] = g->pe[i] = 0;
  } else if (!strcmp(g->auto_pad, "SAME_UPPER") || !strcmp(g->auto_pad, "SAME_LOWER")) {
    bool upper = !strcmp(g->auto_pad, "SAME_UPPER");
    for (int i = 0; i < nk; i++) {
      int64_t in = xs[2 + i], total;
      if (transpose) { /* output = in * stride */
        total = g->s[i] * (in - 1) + (g->k[i] - 1) * g->d[i] + 1 - in * g->s[i];
        if (total < 0) total = 0;
        g->pb[i] = upper ? total / 2 : total - total / 2; /* the spec's ConvTranspose rule */
        g->pe[i] = total - g->pb[i];
        continue;
      }
      int64_t out = (in + g->s[i] - 1) / g->s[i];
      total = (out - 1) * g->s[i] + (g->k[i] - 1) * g->d[i] + 1 - in;
      if (total < 0) total = 0;
      g->pb[i] = upper ? total / 2 : total - total / 2;
      g->pe[i] = total - g->pb[i];
    }
  } else if (strcmp(g->auto_pad, "NOTSET"))
    return op_fail(r, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", g->auto_pad);
  return true;
}

static void geo_opts(const Geo *g, tg_window_opts *o, bool pool) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < g->nk; i++) {
    if (pool) o->kernel_size[i] = g->k[i];
    o->stride[i] = g->s[i];
    o->dilation[i] = g->d[i];
    o->padding[2 * (g->nk - 1 - i)] = g->pb[i];
    o->padding[2 * (g->nk - 1 - i) + 1] = g->pe[i];
  }
  o->npadding = 2 * g->nk;
}

static bool op_Conv(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), w = IN(r, n, 1), b = IN(r, n, 2);
  int64_t xs[ONNX_MAX_DIMS], ws[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs), wd = in_shape(r, n, 1, ws);
  if (nd < 0 || wd < 0) return false;
  if (nd < 3 || wd != nd)
    return op_fail(r, "Conv needs X (N, C, spatial...) and W of the same rank, got %d-d and %d-d", nd, wd);
  Geo g;
  if (!geometry(r, n, xs, nd - 2, ws + 2, &g, false)) return false;
  tg_window_opts o;
  geo_opts(&g, &o, false);
  o.groups = ai(n, "group", 1);
  return out1(r, n, tg_conv_nd(x, w, b, &o));
}

static bool op_ConvTranspose(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), w = IN(r, n, 1), b = IN(r, n, 2);
  int64_t xs[ONNX_MAX_DIMS], ws[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs), wd = in_shape(r, n, 1, ws);
  if (nd < 0 || wd < 0) return false;
  if (nd < 3 || wd != nd)
    return op_fail(r, "ConvTranspose needs X (N, C, spatial...) and W of the same rank, got %d-d and %d-d",
                   nd, wd);
  Geo g;
  int nk = nd - 2;
  if (!geometry(r, n, xs, nk, ws + 2, &g, true)) return false;
  int64_t op[TG_WINDOW_MAXDIMS] = {0};
  const I64s *opa = aints(n, "output_padding");
  if (opa && opa->n != (size_t)nk)
    return op_fail(r, "output_padding has %zu entries for %d spatial dims", opa->n, nk);
  for (int i = 0; opa && i < nk; i++) {
    op[i] = opa->v[i];
    if (op[i] < 0 || op[i] > ONNX_MAX_WINDOW)
      return op_fail(r, "output_padding %lld is out of range", (long long)op[i]);
  }
  const I64s *os = aints(n, "output_shape");
  if (os) { /* pads from the requested output size */
    if (os->n != (size_t)nk && os->n != (size_t)nd) return op_fail(r, "output_shape has %zu entries", os->n);
    bool upper = !strcmp(g.auto_pad, "SAME_UPPER");
    for (int i = 0; i < nk; i++) {
      int64_t want_ = os->v[os->n - nk + i];
      if (want_ < 0 || want_ > ONNX_MAX_WINDOW)
        return op_fail(r, "output_shape entry %lld is out of range", (long long)want_);
      int64_t total = g.s[i] * (xs[2 + i] - 1) + op[i] + (g.k[i] - 1) * g.d[i] + 1 - want_;
      if (total < 0) { /* a larger output: the extra goes to output_padding */
        op[i] -= total;
        total = 0;
      }
      g.pb[i] = upper ? total / 2 : total - total / 2;
      g.pe[i] = total - g.pb[i];
    }
  }
  tg_window_opts o;
  geo_opts(&g, &o, false);
  o.groups = ai(n, "group", 1);
  for (int i = 0; i < nk; i++) o.output_padding[i] = op[i];
  o.noutput_padding = nk;
  return out1(r, n, tg_conv_transpose_nd(x, w, b, &o));
}

static bool pool(Run *r, const Node *n, bool mx) {
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  const I64s *ks = aints(n, "kernel_shape");
  if (!ks) return op_fail(r, "kernel_shape is required");
  if (nd != (int)ks->n + 2) return op_fail(r, "kernel_shape has %zu entries for a %d-d input", ks->n, nd);
  Geo g;
  if (!geometry(r, n, xs, nd - 2, NULL, &g, false)) return false;
  tg_window_opts o;
  geo_opts(&g, &o, true);
  o.ceil_mode = ai(n, "ceil_mode", 0) != 0;
  if (mx) return out1(r, n, tg_max_pool_nd(x, g.nk, &o));
  o.exclude_pad = ai(n, "count_include_pad", 0) == 0;
  return out1(r, n, tg_avg_pool_nd(x, g.nk, &o));
}
/* MaxPool's optional Indices: flat indices into the whole input (N, C, H, W), row-major (storage_order
 * 0) or with each plane column-major (1), from tg_max_pool2d_with_indices' per-plane h * W + w. */
static bool op_MaxPool(Run *r, const Node *n) {
  if (n->nout < 2 || n->out[1] < 0) return pool(r, n, true);
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd != 4) return op_fail(r, "MaxPool's Indices output needs a 4-d input (N, C, H, W), got %d-d", nd);
  const I64s *ks = aints(n, "kernel_shape");
  if (!ks || ks->n != 2) return op_fail(r, "kernel_shape with 2 entries is required");
  Geo g;
  if (!geometry(r, n, xs, 2, NULL, &g, false)) return false;
  tg_pool2d_opts o = {.kernel_size = {g.k[0], g.k[1]},
                      .stride = {g.s[0], g.s[1]},
                      .dilation = {g.d[0], g.d[1]},
                      .padding = {g.pb[1], g.pe[1], g.pb[0], g.pe[0]},
                      .npadding = 4,
                      .ceil_mode = ai(n, "ceil_mode", 0) != 0};
  tg_tensor v, ix;
  if (tg_max_pool2d_with_indices(x, &o, &v, &ix) != TG_OK) return false;
  ix = tg_cast(ix, TG_INT64);
  if (ai(n, "storage_order", 0)) /* h * W + w -> w * H + h */
    ix = tg_add(tg_mul_s(tg_mod(ix, tg_const_like(ix, (double)xs[3])), (double)xs[2]),
                tg_idiv(ix, tg_const_like(ix, (double)xs[3])));
  tg_tensor plane = tg_arange(0, (double)(xs[0] * xs[1]), 1,
                              &(tg_opts){.dtype = TG_INT64, .device = r->m->device, .requires_grad = false});
  plane = tg_reshape(tg_mul_s(plane, (double)(xs[2] * xs[3])), (int64_t[]){xs[0], xs[1], 1, 1}, 4);
  set_out(r, n, 0, v);
  set_out(r, n, 1, tg_add(ix, plane));
  return tg_valid(r->v[n->out[1]].t);
}
static bool op_AveragePool(Run *r, const Node *n) { return pool(r, n, false); }

static bool global_pool(Run *r, const Node *n, bool mx) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  if (nd < 3) return op_fail(r, "a global pool needs (N, C, spatial...), got a %d-d tensor", nd);
  int axes[ONNX_MAX_DIMS];
  for (int i = 2; i < nd; i++) axes[i - 2] = i;
  return out1(r, n, mx ? tg_max(x, axes, nd - 2, true) : tg_mean(x, axes, nd - 2, true));
}
static bool op_GlobalAveragePool(Run *r, const Node *n) { return global_pool(r, n, false); }
static bool op_GlobalMaxPool(Run *r, const Node *n) { return global_pool(r, n, true); }

static bool op_BatchNormalization(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale = IN(r, n, 1), bias = IN(r, n, 2), mean = IN(r, n, 3), var = IN(r, n, 4);
  double eps = af(n, "epsilon", 1e-5);
  tg_tensor invstd = tg_rsqrt(tg_add_s(var, eps));
  return out1(r, n, tg_batchnorm(x, scale, bias, mean, invstd));
}

static bool op_InstanceNormalization(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale = IN(r, n, 1), bias = IN(r, n, 2);
  int nd = rank(x);
  if (nd < 0) return false;
  if (nd < 3) return op_fail(r, "InstanceNormalization needs (N, C, spatial...), got a %d-d tensor", nd);
  int axes[ONNX_MAX_DIMS];
  for (int i = 2; i < nd; i++) axes[i - 2] = i;
  int64_t cs[ONNX_MAX_DIMS];
  for (int i = 0; i < nd; i++) cs[i] = i == 1 ? -1 : 1;
  tg_tensor mean = tg_mean(x, axes, nd - 2, true);
  tg_tensor c = tg_sub(x, mean);
  tg_tensor var = tg_mean(tg_mul(c, c), axes, nd - 2, true);
  tg_tensor y = tg_mul(c, tg_rsqrt(tg_add_s(var, af(n, "epsilon", 1e-5))));
  return out1(r, n, tg_add(tg_mul(y, tg_reshape(scale, cs, nd)), tg_reshape(bias, cs, nd)));
}

static bool op_LayerNormalization(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale = IN(r, n, 1);
  int nd = rank(x);
  if (nd < 0) return false;
  int64_t axis = ai(n, "axis", -1);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  double eps = af(n, "epsilon", 1e-5);
  int axes[ONNX_MAX_DIMS], na = nd - (int)axis;
  for (int i = 0; i < na; i++) axes[i] = (int)axis + i;
  tg_tensor mean = tg_mean(x, axes, na, true);
  tg_tensor c = tg_sub(x, mean);
  tg_tensor invstd = tg_rsqrt(tg_add_s(tg_mean(tg_mul(c, c), axes, na, true), eps));
  tg_tensor y = tg_mul(tg_mul(c, invstd), scale);
  if (has_in(n, 2)) y = tg_add(y, IN(r, n, 2));
  if (!out1(r, n, y)) return false;
  set_out(r, n, 1, mean);
  set_out(r, n, 2, invstd);
  return true;
}

static bool op_CumSum(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  double ad;
  if (nd < 0 || !scalar_in(r, n, 1, &ad)) return false;
  int64_t axis = (int64_t)ad;
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  int ax = (int)axis;
  bool rev = ai(n, "reverse", 0) != 0, excl = ai(n, "exclusive", 0) != 0;
  if (rev) x = tg_flip(x, &ax, 1);
  tg_tensor y = tg_cumsum(x, ax);
  if (excl) y = tg_sub(y, x);
  if (rev) y = tg_flip(y, &ax, 1);
  return out1(r, n, y);
}

static bool op_Trilu(Run *r, const Node *n) {
  double k = 0;
  if (has_in(n, 1) && !scalar_in(r, n, 1, &k)) return false;
  tg_tensor x = IN(r, n, 0);
  /* (past +-2^62 every diagonal is off the matrix; the cast of a larger double is undefined) */
  k = k > 0x1p62 ? 0x1p62 : k < -0x1p62 ? -0x1p62 : k;
  return out1(r, n, ai(n, "upper", 1) ? tg_triu(x, (int64_t)k) : tg_tril(x, (int64_t)k));
}

static bool op_Einsum(Run *r, const Node *n) {
  const char *eq = as(n, "equation", NULL);
  if (!eq) return op_fail(r, "equation is required");
  tg_tensor ts[16];
  if (n->nin > 16) return op_fail(r, "more than 16 operands");
  for (int k = 0; k < n->nin; k++) ts[k] = IN(r, n, k);
  return out1(r, n, tg_einsum(eq, ts, n->nin));
}

/* ---- Resize / Upsample ---- */

/* Up to cap values of input k as doubles: a float constant's host copy, a host integer tensor, or
 * read from the tensor. *cnt -1 when the input is absent or empty (Resize's "" and empty roi/scales). */
static bool reals_in(Run *r, const Node *n, int k, double *out, int cap, int *cnt, const char *what) {
  *cnt = -1;
  if (!has_in(n, k)) return true;
  RV *v = &r->v[n->in[k]];
  const Value *val = &r->m->vals[n->in[k]];
  if (v->h) {
    if (v->h->n > cap) return op_fail(r, "%s has %lld entries (at most %d)", what, (long long)v->h->n, cap);
    for (int64_t i = 0; i < v->h->n; i++) out[i] = (double)v->h->v[i];
    *cnt = v->h->n ? (int)v->h->n : -1;
    return true;
  }
  if (val->kind == V_CONST && r->m->consts[val->ref].fv) {
    const Const *c = &r->m->consts[val->ref];
    if (c->nfv > cap) return op_fail(r, "%s has %lld entries (at most %d)", what, (long long)c->nfv, cap);
    for (int64_t i = 0; i < c->nfv; i++) out[i] = c->fv[i];
    *cnt = c->nfv ? (int)c->nfv : -1;
    return true;
  }
  tg_tensor t = IN(r, n, k);
  int64_t numel = tg_numel(t);
  if (numel < 0) return false;
  if (numel > cap) return op_fail(r, "%s has %lld entries (at most %d)", what, (long long)numel, cap);
  if (numel == 0) return true;
  if (tg_data(tg_cast(t, TG_FLOAT64), out, (size_t)numel * sizeof *out) != TG_OK) return false;
  *cnt = (int)numel;
  return true;
}

enum { RS_NEAREST, RS_LINEAR, RS_CUBIC };

/* One resized axis: per output position up to 4 source indices (clamped into the input, as the
 * spec's edge padding) and their weights, computed on the host, applied as gathers along the axis. */
static tg_tensor resize_axis(Run *r, tg_tensor x, int axis, int64_t in, int64_t out, double scale, int mode,
                             const char *ctm, const char *nmode, double A, bool exclude) {
  int nt = mode == RS_NEAREST ? 1 : mode == RS_LINEAR ? 2 : 4;
  int64_t *idx = malloc((size_t)(out * nt) * sizeof *idx);
  double *w = malloc((size_t)(out * nt) * sizeof *w);
  tg_tensor y = {0};
  if (!idx || !w) {
    op_fail(r, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < out; i++) {
    double xo, fi = (double)i;
    if (!strcmp(ctm, "half_pixel"))
      xo = (fi + 0.5) / scale - 0.5;
    else if (!strcmp(ctm, "pytorch_half_pixel"))
      xo = out > 1 ? (fi + 0.5) / scale - 0.5 : 0;
    else if (!strcmp(ctm, "align_corners"))
      xo = out > 1 ? fi * (double)(in - 1) / (double)(out - 1) : 0;
    else if (!strcmp(ctm, "asymmetric"))
      xo = fi / scale;
    else if (!strcmp(ctm, "tf_half_pixel_for_nn"))
      xo = (fi + 0.5) / scale;
    else /* half_pixel_symmetric */
      xo = (double)in / 2 * (1 - (double)out / (scale * (double)in)) + (fi + 0.5) / scale - 0.5;
    int64_t *ix = idx + i * nt;
    double *wi = w + i * nt;
    if (mode == RS_NEAREST) {
      double f = floor(xo), fr = xo - f, v;
      if (!strcmp(nmode, "floor"))
        v = f;
      else if (!strcmp(nmode, "ceil"))
        v = ceil(xo);
      else if (!strcmp(nmode, "round_prefer_ceil"))
        v = fr >= 0.5 ? f + 1 : f;
      else /* round_prefer_floor */
        v = fr > 0.5 ? f + 1 : f;
      ix[0] = v < 0 ? 0 : v > (double)(in - 1) ? in - 1 : (int64_t)v;
      wi[0] = 1;
      continue;
    }
    double f = floor(xo), t = xo - f;
    int64_t x0 = (int64_t)f;
    if (mode == RS_LINEAR) {
      ix[0] = x0, ix[1] = x0 + 1;
      wi[0] = 1 - t, wi[1] = t;
    } else {
      double d[4] = {t + 1, t, 1 - t, 2 - t};
      for (int j = 0; j < 4; j++) {
        double a = d[j];
        ix[j] = x0 - 1 + j;
        wi[j] = a <= 1 ? ((A + 2) * a - (A + 3)) * a * a + 1 : ((A * a - 5 * A) * a + 8 * A) * a - 4 * A;
      }
    }
    double sum = 0;
    for (int j = 0; j < nt; j++) {
      if (exclude && (ix[j] < 0 || ix[j] >= in)) wi[j] = 0;
      sum += wi[j];
      ix[j] = ix[j] < 0 ? 0 : ix[j] >= in ? in - 1 : ix[j];
    }
    if (exclude && sum != 0)
      for (int j = 0; j < nt; j++) wi[j] /= sum;
  }
  {
    int nd = rank(x);
    int64_t xs[ONNX_MAX_DIMS], rs[ONNX_MAX_DIMS], es[ONNX_MAX_DIMS];
    tg_shape(x, xs);
    for (int d = 0; d < nd; d++) rs[d] = 1, es[d] = xs[d];
    rs[axis] = es[axis] = out;
    tg_opts io = {.dtype = TG_INT64, .device = r->m->device, .requires_grad = false};
    tg_opts wo = {.dtype = TG_FLOAT64, .device = r->m->device, .requires_grad = false};
    tg_tensor it = tg_from_data(idx, (int64_t[]){out, nt}, 2, &io);
    tg_tensor wt = mode == RS_NEAREST ? it : tg_from_data(w, (int64_t[]){out, nt}, 2, &wo);
    if (mode != RS_NEAREST && tg_valid(wt)) wt = tg_cast(wt, tg_dtype_of(x));
    for (int j = 0; j < nt && tg_valid(it) && tg_valid(wt); j++) {
      int64_t b[4] = {0, out, j, j + 1};
      tg_tensor ij = tg_expand(tg_reshape(tg_shrink(it, b, 4), rs, nd), es, nd);
      tg_tensor g = tg_gather(x, axis, ij);
      if (mode == RS_NEAREST) {
        y = g;
        break;
      }
      tg_tensor term = tg_mul(g, tg_reshape(tg_shrink(wt, b, 4), rs, nd));
      y = j ? tg_add(y, term) : term;
    }
  }
done:
  free(idx);
  free(w);
  return y;
}

/* Resize (opsets 10-19) and Upsample (7-9): scales (or sizes) -> output size per axis, then one
 * separable pass per resized axis. */
static bool resize(Run *r, const Node *n, bool upsample) {
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd == 0) return op_fail(r, "%s of a 0-d tensor", n->op);
  const char *mname = as(n, "mode", "nearest");
  int mode = !strcmp(mname, "nearest")                                ? RS_NEAREST
             : !strcmp(mname, "linear") || !strcmp(mname, "bilinear") ? RS_LINEAR
             : !strcmp(mname, "cubic") && !upsample                   ? RS_CUBIC
                                                                      : -1;
  if (mode < 0)
    return op_fail(r, "%s mode '%s' is not one of nearest, linear%s", n->op, mname,
                   upsample ? "" : ", cubic");
  const char *ctm = upsample ? "asymmetric" : as(n, "coordinate_transformation_mode", "half_pixel");
  const char *nmode = upsample ? "floor" : as(n, "nearest_mode", "round_prefer_floor");
  static const char *ctms[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",
                               "asymmetric", "tf_half_pixel_for_nn", "half_pixel_symmetric"};
  bool ok = false;
  for (size_t i = 0; i < sizeof ctms / sizeof ctms[0]; i++) ok |= !strcmp(ctm, ctms[i]);
  if (!strcmp(ctm, "tf_crop_and_resize"))
    return op_fail(r, "Resize coordinate_transformation_mode tf_crop_and_resize is not supported");
  if (!ok) return op_fail(r, "Resize coordinate_transformation_mode '%s' is not valid", ctm);
  if (strcmp(nmode, "round_prefer_floor") && strcmp(nmode, "round_prefer_ceil") && strcmp(nmode, "floor") &&
      strcmp(nmode, "ceil"))
    return op_fail(r, "Resize nearest_mode '%s' is not valid", nmode);
  if (ai(n, "antialias", 0)) return op_fail(r, "Resize antialias=1 is not supported");
  bool exclude = ai(n, "exclude_outside", 0) != 0;
  double A = af(n, "cubic_coeff_a", -0.75);
  /* which axes the scales/sizes entries describe */
  int axes[ONNX_MAX_DIMS], na = nd;
  for (int i = 0; i < nd; i++) axes[i] = i;
  const I64s *aa = aints(n, "axes");
  if (aa && !upsample) {
    if (aa->n < 1 || aa->n > (size_t)nd)
      return op_fail(r, "axes has %zu entries for a %d-d tensor", aa->n, nd);
    na = (int)aa->n;
    for (int i = 0; i < na; i++) {
      int64_t a = aa->v[i];
      if (!norm_axis(r, &a, nd, "axis")) return false;
      for (int j = 0; j < i; j++)
        if (axes[j] == a) return op_fail(r, "axis %lld is given twice", (long long)aa->v[i]);
      axes[i] = (int)a;
    }
  }
  double sc[ONNX_MAX_DIMS], sz[ONNX_MAX_DIMS];
  int nsc = -1, nsz = -1;
  if (upsample) {
    const Attr *at = attr(n, "scales");
    if (at && at->type == AT_FLOATS) {
      if (at->floats.n > (size_t)ONNX_MAX_DIMS) return op_fail(r, "scales has %zu entries", at->floats.n);
      nsc = (int)at->floats.n;
      for (int i = 0; i < nsc; i++) sc[i] = at->floats.v[i];
    } else if (!reals_in(r, n, 1, sc, ONNX_MAX_DIMS, &nsc, "scales"))
      return false;
  } else {
    int ks = r->m->opset < 11 || n->nin == 2 ? 1 : 2;
    if (!reals_in(r, n, ks, sc, ONNX_MAX_DIMS, &nsc, "scales")) return false;
    if (ks == 2 && !reals_in(r, n, 3, sz, ONNX_MAX_DIMS, &nsz, "sizes")) return false;
  }
  if (nsc > 0 && nsz > 0) return op_fail(r, "%s has both scales and sizes; give one", n->op);
  if (nsc < 0 && nsz < 0) return op_fail(r, "%s needs scales or sizes", n->op);
  int cnt = nsc > 0 ? nsc : nsz;
  if (cnt != na) return op_fail(r, "%s has %d entries for %d axes", nsc > 0 ? "scales" : "sizes", cnt, na);
  int64_t osz[ONNX_MAX_DIMS];
  double scale[ONNX_MAX_DIMS];
  for (int d = 0; d < nd; d++) osz[d] = xs[d], scale[d] = 1;
  const char *policy = as(n, "keep_aspect_ratio_policy", "stretch");
  if (nsz > 0 && strcmp(policy, "stretch")) {
    bool larger = !strcmp(policy, "not_smaller");
    if (!larger && strcmp(policy, "not_larger"))
      return op_fail(r, "keep_aspect_ratio_policy '%s' is not one of stretch, not_larger, not_smaller",
                     policy);
    double s = 0;
    for (int i = 0; i < na; i++) {
      double si = sz[i] / (double)xs[axes[i]];
      if (i == 0 || (larger ? si > s : si < s)) s = si;
    }
    for (int i = 0; i < na; i++) sz[i] = floor(s * (double)xs[axes[i]] + 0.5), sc[i] = s;
  } else if (nsz > 0)
    for (int i = 0; i < na; i++) sc[i] = sz[i] / (double)xs[axes[i]];
  for (int i = 0; i < na; i++) {
    double o = nsz > 0 ? sz[i] : floor((double)xs[axes[i]] * sc[i]);
    if (!(sc[i] > 0) || !(o >= 0) || o > (double)ONNX_MAX_WINDOW)
      return op_fail(r, "%s %g for axis %d (input size %lld) is not valid", nsz > 0 ? "size" : "scale",
                     nsz > 0 ? sz[i] : sc[i], axes[i], (long long)xs[axes[i]]);
    osz[axes[i]] = (int64_t)o;
    scale[axes[i]] = sc[i];
  }
  for (int d = 0; d < nd; d++)
    if (osz[d] == 0 || xs[d] == 0)
      return out1(
          r, n,
          tg_empty(osz, nd,
                   &(tg_opts){.dtype = tg_dtype_of(x), .device = r->m->device, .requires_grad = false}));
  tg_dtype dt = tg_dtype_of(x);
  bool conv = mode != RS_NEAREST && dt != TG_FLOAT32 && dt != TG_FLOAT64;
  tg_tensor y = conv ? tg_cast(x, TG_FLOAT32) : x;
  bool shifted = !strcmp(ctm, "tf_half_pixel_for_nn"); /* not the identity even at scale 1 */
  for (int d = nd - 1; d >= 0 && tg_valid(y); d--)
    if (osz[d] != xs[d] || scale[d] != 1 || shifted)
      y = resize_axis(r, y, d, xs[d], osz[d], scale[d], mode, ctm, nmode, A, exclude);
  if (conv && tg_valid(y)) y = tg_cast(is_intlike(dt) ? tg_round(y) : y, dt);
  return out1(r, n, y);
}
static bool op_Resize(Run *r, const Node *n) { return resize(r, n, false); }
static bool op_Upsample(Run *r, const Node *n) { return resize(r, n, true); }

/* ---- TopK: k from the attribute (opset 1) or input 1 (10+); values and int64 indices ---- */
static bool op_TopK(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int nd = rank(x);
  if (nd < 0) return false;
  if (nd == 0) return op_fail(r, "TopK of a 0-d tensor");
  int64_t axis = ai(n, "axis", -1);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  double kd;
  if (has_in(n, 1)) {
    if (!scalar_in(r, n, 1, &kd)) return false;
  } else if (attr(n, "k"))
    kd = (double)ai(n, "k", 0);
  else
    return op_fail(r, "TopK needs K (input 1, or the k attribute before opset 10)");
  int64_t size = tg_dim(x, (int)axis);
  if (!(kd >= 0) || kd > (double)size)
    return op_fail(r, "K %g is out of range for a dim of size %lld", kd, (long long)size);
  tg_tensor v, ix;
  if (tg_topk(x, (int64_t)kd, (int)axis, ai(n, "largest", 1) != 0, ai(n, "sorted", 1) != 0, &v, &ix) != TG_OK)
    return false;
  set_out(r, n, 0, v);
  set_out(r, n, 1, tg_cast(ix, TG_INT64));
  return n->nout < 2 || n->out[1] < 0 || tg_valid(r->v[n->out[1]].t);
}

/* ---- GroupNormalization: scale and bias per channel (opset 21) or per group (opset 18's form) ---- */
static bool op_GroupNormalization(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale = IN(r, n, 1), bias = IN(r, n, 2);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd < 2) return op_fail(r, "GroupNormalization needs (N, C, ...), got a %d-d tensor", nd);
  int64_t g = ai(n, "num_groups", 0), c = xs[1];
  if (g < 1 || c % g)
    return op_fail(r, "num_groups %lld does not divide %lld channels", (long long)g, (long long)c);
  int64_t ns = tg_numel(scale), nb = tg_numel(bias);
  if (ns < 0 || nb < 0) return false;
  if ((ns != c && ns != g) || nb != ns)
    return op_fail(r, "scale and bias have %lld and %lld elements; give %lld (channels) or %lld (groups)",
                   (long long)ns, (long long)nb, (long long)c, (long long)g);
  tg_dtype dt = tg_dtype_of(x);
  bool up = dt != TG_FLOAT32 && dt != TG_FLOAT64 && ai(n, "stash_type", 1) == 1;
  tg_tensor y = tg_reshape(up ? tg_cast(x, TG_FLOAT32) : x, (int64_t[]){xs[0], g, -1}, 3);
  int ax = 2;
  tg_tensor mean = tg_mean(y, &ax, 1, true);
  tg_tensor cn = tg_sub(y, mean);
  tg_tensor var = tg_mean(tg_mul(cn, cn), &ax, 1, true);
  y = tg_mul(cn, tg_rsqrt(tg_add_s(var, af(n, "epsilon", 1e-5))));
  if (up) y = tg_cast(y, dt);
  int64_t cs[ONNX_MAX_DIMS];
  if (ns == c && c != g) {
    y = tg_reshape(y, xs, nd);
    for (int i = 0; i < nd; i++) cs[i] = i == 1 ? c : 1;
    return out1(r, n, tg_add(tg_mul(y, tg_reshape(scale, cs, nd)), tg_reshape(bias, cs, nd)));
  }
  int64_t gs[3] = {1, g, 1};
  y = tg_add(tg_mul(y, tg_reshape(scale, gs, 3)), tg_reshape(bias, gs, 3));
  return out1(r, n, tg_reshape(y, xs, nd));
}

/* ---- DepthToSpace (DCR, CRD) / SpaceToDepth on (N, C, H, W) ---- */
static bool op_DepthToSpace(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd != 4) return op_fail(r, "DepthToSpace needs (N, C, H, W), got a %d-d tensor", nd);
  int64_t b = ai(n, "blocksize", 0);
  if (b < 1 || b > 65536 || xs[1] % (b * b))
    return op_fail(r, "blocksize %lld does not divide the %lld channels into blocksize^2 groups",
                   (long long)b, (long long)xs[1]);
  const char *mode = as(n, "mode", "DCR");
  bool crd = !strcmp(mode, "CRD");
  if (!crd && strcmp(mode, "DCR")) return op_fail(r, "DepthToSpace mode '%s' is not DCR or CRD", mode);
  int64_t c = xs[1] / (b * b);
  int64_t s6[6] = {xs[0], b, b, c, xs[2], xs[3]}, c6[6] = {xs[0], c, b, b, xs[2], xs[3]};
  int pd[6] = {0, 3, 4, 1, 5, 2}, pc[6] = {0, 1, 4, 2, 5, 3};
  tg_tensor y = tg_permute(tg_reshape(x, crd ? c6 : s6, 6), crd ? pc : pd, 6);
  return out1(r, n, tg_reshape(y, (int64_t[]){xs[0], c, xs[2] * b, xs[3] * b}, 4));
}
static bool op_SpaceToDepth(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd != 4) return op_fail(r, "SpaceToDepth needs (N, C, H, W), got a %d-d tensor", nd);
  int64_t b = ai(n, "blocksize", 0);
  if (b < 1 || b > 65536 || xs[2] % b || xs[3] % b)
    return op_fail(r, "blocksize %lld does not divide H %lld and W %lld", (long long)b, (long long)xs[2],
                   (long long)xs[3]);
  int p[6] = {0, 3, 5, 1, 2, 4};
  tg_tensor y = tg_reshape(x, (int64_t[]){xs[0], xs[1], xs[2] / b, b, xs[3] / b, b}, 6);
  y = tg_permute(y, p, 6);
  return out1(r, n, tg_reshape(y, (int64_t[]){xs[0], xs[1] * b * b, xs[2] / b, xs[3] / b}, 4));
}

/* ---- Hardmax: 1 at the first maximum along axis (opset < 13: of the 2-D flattening at axis) ---- */
static bool op_Hardmax(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0);
  int64_t xs[ONNX_MAX_DIMS];
  int nd = in_shape(r, n, 0, xs);
  if (nd < 0) return false;
  if (nd == 0) return op_fail(r, "Hardmax of a 0-d tensor");
  int64_t axis = ai(n, "axis", r->m->opset >= 13 ? -1 : 1);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  tg_tensor y = x;
  int ax = (int)axis;
  if (r->m->opset < 13) {
    int64_t two[2] = {1, 1};
    for (int i = 0; i < nd; i++) two[i < axis ? 0 : 1] *= xs[i];
    y = tg_reshape(x, two, 2);
    ax = 1;
  }
  int yn = r->m->opset < 13 ? 2 : nd;
  int64_t size = tg_dim(y, ax);
  tg_tensor am = tg_argmax(y, &ax, 1, true); /* the first maximum */
  tg_tensor pos = tg_arange(0, (double)size, 1,
                            &(tg_opts){.dtype = TG_INT32, .device = r->m->device, .requires_grad = false});
  int64_t ps[ONNX_MAX_DIMS];
  for (int i = 0; i < yn; i++) ps[i] = i == ax ? size : 1;
  y = tg_cast(tg_eq(tg_cast(am, TG_INT32), tg_reshape(pos, ps, yn)), tg_dtype_of(x));
  return out1(r, n, r->m->opset < 13 ? tg_reshape(y, xs, nd) : y);
}

/* ---- QuantizeLinear / DequantizeLinear (per tensor or per axis; blocked forms refused) and
 * MatMulInteger ---- */
static bool quant_param(Run *r, const Node *n, int k, tg_tensor x, int64_t axis, tg_tensor *out) {
  tg_tensor p = IN(r, n, k);
  int nd = rank(x), pd = rank(p);
  if (nd < 0 || pd < 0) return false;
  int64_t np_ = tg_numel(p);
  if (np_ == 1) {
    *out = tg_reshape(p, NULL, 0);
    return tg_valid(*out);
  }
  if (pd != 1)
    return op_fail(r, "%s: blocked quantization (a %d-d scale or zero point) is not supported", n->op, pd);
  if (!norm_axis(r, &axis, nd, "axis")) return false;
  if (np_ != tg_dim(x, (int)axis))
    return op_fail(r, "%s: %lld scales or zero points for axis %lld of size %lld", n->op, (long long)np_,
                   (long long)axis, (long long)tg_dim(x, (int)axis));
  int64_t s[ONNX_MAX_DIMS];
  for (int i = 0; i < nd; i++) s[i] = i == axis ? np_ : 1;
  *out = tg_reshape(p, s, nd);
  return tg_valid(*out);
}

static bool op_DequantizeLinear(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale, zp = {0};
  if (ai(n, "block_size", 0)) return op_fail(r, "DequantizeLinear block_size is not supported");
  int64_t axis = ai(n, "axis", 1);
  if (!quant_param(r, n, 1, x, axis, &scale)) return false;
  if (has_in(n, 2) && !quant_param(r, n, 2, x, axis, &zp)) return false;
  tg_tensor xf = tg_cast(x, TG_FLOAT32);
  if (zp.id) xf = tg_sub(xf, tg_cast(zp, TG_FLOAT32));
  tg_tensor y = tg_mul(xf, tg_cast(scale, TG_FLOAT32));
  return out1(r, n, tg_cast(y, tg_dtype_of(scale)));
}

static bool op_QuantizeLinear(Run *r, const Node *n) {
  tg_tensor x = IN(r, n, 0), scale, zp = {0};
  if (ai(n, "block_size", 0)) return op_fail(r, "QuantizeLinear block_size is not supported");
  int64_t axis = ai(n, "axis", 1);
  if (!quant_param(r, n, 1, x, axis, &scale)) return false;
  if (has_in(n, 2) && !quant_param(r, n, 2, x, axis, &zp)) return false;
  tg_dtype dt = zp.id                      ? tg_dtype_of(zp)
                : ai(n, "output_dtype", 0) ? onnx_dtype(ai(n, "output_dtype", 0))
                                           : TG_UINT8;
  if (dt != TG_UINT8 && dt != TG_INT8 && dt != TG_UINT16 && dt != TG_INT16)
    return op_fail(r, "QuantizeLinear to %s is not supported (uint8, int8, uint16, int16 are)",
                   tg_dtype_name(dt));
  double lo = dt == TG_UINT8 || dt == TG_UINT16 ? 0 : dt == TG_INT8 ? -128 : -32768;
  double hi = dt == TG_UINT8 ? 255 : dt == TG_INT8 ? 127 : dt == TG_UINT16 ? 65535 : 32767;
  tg_tensor y = tg_round(tg_div(tg_cast(x, TG_FLOAT32), tg_cast(scale, TG_FLOAT32)));
  if (zp.id) y = tg_add(y, tg_cast(zp, TG_FLOAT32));
  return out1(r, n, tg_cast(tg_clamp(y, lo, hi), dt));
}

static bool op_MatMulInteger(Run *r, const Node *n) {
  tg_tensor a = tg_cast(IN(r, n, 0), TG_INT32), b = tg_cast(IN(r, n, 1), TG_INT32);
  int na = rank(a), nb = rank(b);
  if (na < 0 || nb < 0) return false;
  if (na < 1 || nb < 1) return op_fail(r, "MatMulInteger of a 0-d tensor");
  if (has_in(n, 2)) { /* scalar, or one per row of A */
    tg_tensor z = tg_cast(IN(r, n, 2), TG_INT32);
    if (tg_numel(z) != 1 && na >= 2) z = tg_unsqueeze(z, -1);
    a = tg_sub(a, z);
  }
  if (has_in(n, 3)) b = tg_sub(b, tg_cast(IN(r, n, 3), TG_INT32)); /* scalar, or one per column of B */
  bool sa = na == 1, sb = nb == 1;
  if (sa) a = tg_unsqueeze(a, 0);
  if (sb) b = tg_unsqueeze(b, 1);
  tg_tensor y = tg_matmul(a, b);
  if (sb) y = tg_squeeze(y, -1);
  if (sa) y = tg_squeeze(y, -2 + (sb ? 1 : 0));
  return out1(r, n, tg_valid(y) && tg_dtype_of(y) != TG_INT32 ? tg_cast(y, TG_INT32) : y);
}

/* ==== the op table ============================================================================= */

#define OP(NAME, MIN, MAX, OUT)                                                                              \
  { #NAME, op_##NAME, NULL, MIN, MAX, OUT }
#define OPF(NAME, MIN, MAX, OUT)                                                                             \
  { #NAME, op_##NAME, fold_##NAME, MIN, MAX, OUT }
static const OpDef ops[] = {
    OPF(Add, 2, 2, 1),
    OPF(Sub, 2, 2, 1),
    OPF(Mul, 2, 2, 1),
    OPF(Div, 2, 2, 1),
    OP(Pow, 2, 2, 1),
    OP(Mod, 2, 2, 1),
    OPF(Equal, 2, 2, 1),
    OPF(Less, 2, 2, 1),
    OPF(Greater, 2, 2, 1),
    OPF(LessOrEqual, 2, 2, 1),
    OPF(GreaterOrEqual, 2, 2, 1),
    OPF(And, 2, 2, 1),
    OPF(Or, 2, 2, 1),
    OP(Xor, 2, 2, 1),
    OPF(Not, 1, 1, 1),
    OP(BitwiseAnd, 2, 2, 1),
    OP(BitwiseOr, 2, 2, 1),
    OP(BitwiseXor, 2, 2, 1),
    OPF(Where, 3, 3, 1),
    OP(Sum, 1, 1 << 20, 1),
    OP(Mean, 1, 1 << 20, 1),
    OPF(Max, 1, 1 << 20, 1),
    OPF(Min, 1, 1 << 20, 1),
    OP(PRelu, 2, 2, 1),
    OP(Relu, 1, 1, 1),
    OP(Sigmoid, 1, 1, 1),
    OP(Tanh, 1, 1, 1),
    OP(Exp, 1, 1, 1),
    OP(Log, 1, 1, 1),
    OP(Sqrt, 1, 1, 1),
    OPF(Neg, 1, 1, 1),
    OPF(Abs, 1, 1, 1),
    OP(Reciprocal, 1, 1, 1),
    OP(Floor, 1, 1, 1),
    OP(Ceil, 1, 1, 1),
    OP(Round, 1, 1, 1),
    OP(Sin, 1, 1, 1),
    OP(Cos, 1, 1, 1),
    OP(Tan, 1, 1, 1),
    OP(Erf, 1, 1, 1),
    OP(Sign, 1, 1, 1),
    OP(Softsign, 1, 1, 1),
    OP(HardSwish, 1, 1, 1),
    OP(Mish, 1, 1, 1),
    OP(IsNaN, 1, 1, 1),
    OP(IsInf, 1, 1, 1),
    OP(LeakyRelu, 1, 1, 1),
    OP(Elu, 1, 1, 1),
    OP(Celu, 1, 1, 1),
    OP(Selu, 1, 1, 1),
    OP(HardSigmoid, 1, 1, 1),
    OP(Softplus, 1, 1, 1),
    OP(Gelu, 1, 1, 1),
    OPF(Identity, 1, 1, 1),
    OP(Dropout, 1, 3, 2),
    OPF(Cast, 1, 1, 1),
    OP(CastLike, 2, 2, 1),
    OP(Clip, 1, 3, 1),
    OP(Softmax, 1, 1, 1),
    OP(LogSoftmax, 1, 1, 1),
    OP(ReduceSum, 1, 2, 1),
    OP(ReduceMean, 1, 2, 1),
    OP(ReduceMax, 1, 2, 1),
    OP(ReduceMin, 1, 2, 1),
    OP(ReduceProd, 1, 2, 1),
    OP(ReduceL1, 1, 2, 1),
    OP(ReduceL2, 1, 2, 1),
    OP(ReduceSumSquare, 1, 2, 1),
    OP(ReduceLogSum, 1, 2, 1),
    OP(ReduceLogSumExp, 1, 2, 1),
    OP(ArgMax, 1, 1, 1),
    OP(ArgMin, 1, 1, 1),
    OPF(Shape, 1, 1, 1),
    OPF(Size, 1, 1, 1),
    OPF(Reshape, 1, 2, 1),
    OPF(Flatten, 1, 1, 1),
    OP(Transpose, 1, 1, 1),
    OPF(Squeeze, 1, 2, 1),
    OPF(Unsqueeze, 1, 2, 1),
    OPF(Expand, 2, 2, 1),
    OPF(Concat, 1, 1 << 20, 1),
    OP(Split, 1, 2, 1 << 20),
    OPF(Slice, 1, 5, 1),
    OPF(Gather, 2, 2, 1),
    OP(GatherElements, 2, 2, 1),
    OP(Tile, 2, 2, 1),
    OP(Pad, 1, 4, 1),
    OPF(ConstantOfShape, 1, 1, 1),
    OPF(Range, 3, 3, 1),
    OP(MatMul, 2, 2, 1),
    OP(Gemm, 2, 3, 1),
    OP(Conv, 2, 3, 1),
    OP(ConvTranspose, 2, 3, 1),
    OP(MaxPool, 1, 1, 2),
    OP(AveragePool, 1, 1, 1),
    OP(GlobalAveragePool, 1, 1, 1),
    OP(GlobalMaxPool, 1, 1, 1),
    OP(BatchNormalization, 5, 5, 1),
    OP(InstanceNormalization, 3, 3, 1),
    OP(LayerNormalization, 2, 3, 3),
    OP(CumSum, 2, 2, 1),
    OP(Trilu, 1, 2, 1),
    OP(Einsum, 1, 16, 1),
    OP(Resize, 1, 4, 1),
    OP(Upsample, 1, 2, 1),
    OP(TopK, 1, 2, 2),
    OP(GroupNormalization, 3, 3, 1),
    OP(DepthToSpace, 1, 1, 1),
    OP(SpaceToDepth, 1, 1, 1),
    OP(Hardmax, 1, 1, 1),
    OP(QuantizeLinear, 2, 3, 1),
    OP(DequantizeLinear, 2, 3, 1),
    OP(MatMulInteger, 2, 4, 1),
};

static const OpDef *op_find(const char *name) {
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (!strcmp(ops[i].name, name)) return &ops[i];
  return NULL;
}

/* ==== load: resolve names, check the graph, order the nodes ===================================== */

void tg_onnx_free(tg_onnx *m) {
  if (!m) return;
  for (int i = 0; i < m->nconsts; i++) {
    if (tg_valid(m->consts[i].t)) tg_free(m->consts[i].t);
    host_free(m->consts[i].h);
    free(m->consts[i].fv);
  }
  free(m->consts);
  for (int i = 0; i < m->nnodes; i++) node_free(&m->nodes[i]);
  free(m->nodes);
  for (int i = 0; i < m->ninputs; i++) vinfo_free(&m->inputs[i]);
  for (int i = 0; i < m->noutputs; i++) vinfo_free(&m->outputs[i]);
  free(m->inputs);
  free(m->outputs);
  for (int i = 0; i < m->nvals; i++) free(m->vals[i].name);
  free(m->vals);
  free(m->hash);
  free(m->order);
  free(m->path);
  free(m->device);
  free(m);
}

static const char *node_label(const Node *n, int i, char *buf, size_t cap) {
  if (n->name && *n->name)
    snprintf(buf, cap, "node '%.200s' (%.100s)", n->name, n->op);
  else
    snprintf(buf, cap, "node #%d (%.100s)", i, n->op);
  return buf;
}

/* a Constant node's value as a Const */
static bool constant_node(PB *pb, tg_onnx *m, const Node *n, const char *lbl, int *idx) {
  const Attr *a;
  if (n->nat != 1)
    return pb_fail(pb, NULL, "%s: a Constant needs exactly one value attribute, it has %d", lbl, n->nat);
  a = &n->at[0];
  if (!strcmp(a->name, "value")) {
    if (a->t < 0) return pb_fail(pb, NULL, "%s: attribute 'value' is not a tensor", lbl);
    *idx = a->t;
    return true;
  }
  TP t;
  memset(&t, 0, sizeof t);
  t.has_type = true;
  t.name = (char *)"";
  bool scalar = !strcmp(a->name, "value_float") || !strcmp(a->name, "value_int");
  if (!strcmp(a->name, "value_float") || !strcmp(a->name, "value_floats")) {
    t.data_type = 1;
    t.kind = 4;
    F64s one = {&(double){a->f}, 1, 1};
    t.reals = scalar ? one : a->floats;
  } else if (!strcmp(a->name, "value_int") || !strcmp(a->name, "value_ints")) {
    t.data_type = 7;
    t.kind = 7;
    I64s one = {&(int64_t){a->i}, 1, 1};
    t.ints = scalar ? one : a->ints;
  } else
    return pb_fail(pb, NULL,
                   "%s: Constant attribute '%s' is not supported (value, value_float(s), value_int(s) are)",
                   lbl, a->name);
  int64_t d = scalar ? 0 : (int64_t)(t.kind == 4 ? t.reals.n : t.ints.n);
  if (!scalar) t.dims = (I64s){&d, 1, 1};
  return make_const(pb, m, &t, "Constant", idx);
}

static bool check_graph(PB *pb, tg_onnx *m) {
  char lbl[400];
  /* graph inputs (older files list the initializers as inputs too: those are constants) */
  int k = 0;
  for (int i = 0; i < m->ninputs; i++) {
    VInfo *v = &m->inputs[i];
    int id = val_get(m, v->name);
    if (id < 0) return pb_fail(pb, NULL, "out of memory");
    if (m->vals[id].kind == V_CONST) {
      vinfo_free(v);
      continue;
    }
    if (m->vals[id].kind == V_INPUT)
      return pb_fail(pb, NULL, "graph input '%s' is listed twice (duplicate names; corrupt file?)", v->name);
    if (v->not_tensor)
      return pb_fail(pb, NULL,
                     "graph input '%s' is not a tensor (sequence, map and optional types are not supported)",
                     v->name);
    m->vals[id].kind = V_INPUT;
    m->vals[id].ref = k;
    v->val = id;
    m->inputs[k++] = *v;
  }
  m->ninputs = k;
  /* node outputs and ops */
  int active = 0;
  for (int i = 0; i < m->nnodes; i++) {
    Node *n = &m->nodes[i];
    node_label(n, i, lbl, sizeof lbl);
    if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx"))
      return pb_fail(pb, NULL,
                     "%s: operator '%s' of domain '%s' is not supported (only the default ONNX domain is)",
                     lbl, n->op, n->domain);
    bool is_const = !strcmp(n->op, "Constant");
    int cidx = -1;
    if (is_const) {
      if (n->nin != 0 || n->nout != 1)
        return pb_fail(pb, NULL, "%s: a Constant has no inputs and one output", lbl);
      if (!constant_node(pb, m, n, lbl, &cidx)) return false;
    } else {
      n->def = op_find(n->op);
      if (!n->def)
        return pb_fail(
            pb, NULL,
            "%s: operator '%s' is not supported (see docs/DESIGN.md, \"ONNX\", for the supported ops)", lbl,
            n->op);
      if (n->nin < n->def->min_in || n->nin > n->def->max_in)
        return pb_fail(pb, NULL, "%s: %d inputs (the op takes %d to %d)", lbl, n->nin, n->def->min_in,
                       n->def->max_in);
      for (int j = 0; j < n->def->min_in && j < n->nin; j++)
        if (n->in[j] < 0 && strcmp(n->op, "Clip") && strcmp(n->op, "Pad"))
          return pb_fail(pb, NULL, "%s: required input %d is empty", lbl, j);
      int used = 0;
      for (int j = 0; j < n->nout; j++)
        if (n->out[j] >= 0) used = j + 1;
      if (used > n->def->max_out)
        return pb_fail(pb, NULL,
                       "%s: output %d is used but only %d output(s) are supported (e.g. MaxPool's Indices)",
                       lbl, used - 1, n->def->max_out);
      if (!strcmp(n->op, "BatchNormalization") && ai(n, "training_mode", 0))
        return pb_fail(pb, NULL, "%s: training_mode=1 is not supported (export the model in eval mode)", lbl);
      if (!strcmp(n->op, "Split") && n->nout < 1) return pb_fail(pb, NULL, "%s: no outputs", lbl);
      active++;
    }
    for (int j = 0; j < n->nout; j++) {
      int id = n->out[j];
      if (id < 0) continue;
      if (m->vals[id].kind != V_UNDEF)
        return pb_fail(pb, NULL, "%s: output '%s' is already defined (by %s; names must be unique)", lbl,
                       m->vals[id].name,
                       m->vals[id].kind == V_INPUT   ? "a graph input"
                       : m->vals[id].kind == V_CONST ? "an initializer or Constant"
                                                     : "another node");
      m->vals[id].kind = is_const ? V_CONST : V_NODE;
      m->vals[id].ref = is_const ? cidx : i;
    }
  }
  for (int i = 0; i < m->nnodes; i++) {
    Node *n = &m->nodes[i];
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] >= 0 && m->vals[n->in[j]].kind == V_UNDEF)
        return pb_fail(pb, NULL,
                       "%s: input '%s' is never defined (not a graph input, an initializer or a node output)",
                       node_label(n, i, lbl, sizeof lbl), m->vals[n->in[j]].name);
  }
  for (int i = 0; i < m->noutputs; i++) {
    VInfo *v = &m->outputs[i];
    int id = val_find(m, v->name);
    if (id < 0 || m->vals[id].kind == V_UNDEF)
      return pb_fail(pb, NULL, "graph output '%s' is never defined", v->name);
    v->val = id;
  }
  if (m->noutputs == 0) return pb_fail(pb, NULL, "the graph has no outputs");
  /* topological order (Kahn): nodes may be listed in any order, a cycle is an error */
  int nn = m->nnodes;
  int *indeg = calloc((size_t)nn + 1, sizeof *indeg), *start = calloc((size_t)nn + 2, sizeof *start);
  int *adj = NULL, *queue = malloc(((size_t)nn + 1) * sizeof *queue);
  size_t nedges = 0;
  for (int i = 0; i < nn; i++) nedges += (size_t)m->nodes[i].nin;
  adj = malloc((nedges + 1) * sizeof *adj);
  m->order = malloc(((size_t)nn + 1) * sizeof *m->order);
  bool ok = indeg && start && adj && queue && m->order;
  if (!ok) pb_fail(pb, NULL, "out of memory");
  for (int i = 0; ok && i < nn; i++) {
    const Node *n = &m->nodes[i];
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] >= 0 && m->vals[n->in[j]].kind == V_NODE) start[m->vals[n->in[j]].ref + 1]++, indeg[i]++;
  }
  for (int i = 0; ok && i < nn; i++) start[i + 1] += start[i];
  int *fill = ok ? calloc((size_t)nn + 1, sizeof *fill) : NULL;
  if (ok && !fill) ok = pb_fail(pb, NULL, "out of memory");
  for (int i = 0; ok && i < nn; i++) {
    const Node *n = &m->nodes[i];
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] >= 0 && m->vals[n->in[j]].kind == V_NODE) {
        int p = m->vals[n->in[j]].ref;
        adj[start[p] + fill[p]++] = i;
      }
  }
  int qh = 0, qt = 0, cnt = 0;
  for (int i = 0; ok && i < nn; i++)
    if (indeg[i] == 0) queue[qt++] = i;
  while (ok && qh < qt) {
    int i = queue[qh++];
    if (m->nodes[i].def) m->order[cnt++] = i;
    for (int e = start[i]; e < start[i + 1]; e++)
      if (--indeg[adj[e]] == 0) queue[qt++] = adj[e];
  }
  if (ok && qt < nn) {
    int bad = 0;
    while (indeg[bad] == 0) bad++;
    ok = pb_fail(pb, NULL, "%s is part of a cycle (its inputs depend on its own output)",
                 node_label(&m->nodes[bad], bad, lbl, sizeof lbl));
  }
  (void)active;
  m->nnodes_run = cnt;
  free(indeg);
  free(start);
  free(adj);
  free(queue);
  free(fill);
  return ok;
}

tg_onnx *onnx_load_mem(const char *fn, const char *path, const uint8_t *data, size_t len,
                       const char *device) {
  tg_onnx *m = calloc(1, sizeof *m);
  if (!m) {
    tg_set_error(TG_ERR_IO, "%s: %s: out of memory", fn, path);
    return NULL;
  }
  PB pb = {.start = data, .end = data + len, .fn = fn, .path = path};
  bool ok = (m->path = strdup(path)) != NULL && (!device || (m->device = strdup(device)) != NULL);
  if (!ok) pb_fail(&pb, NULL, "out of memory");
  if (ok && len == 0) ok = pb_fail(&pb, NULL, "the file is empty (not an ONNX model)");
  if (ok) ok = parse_model(&pb, m, (Cur){data, data + len}) && check_graph(&pb, m);
  if (!ok) {
    tg_onnx_free(m);
    return NULL;
  }
  return m;
}

tg_onnx *tg_onnx_load(const char *path, const char *device) {
  if (!path) {
    tg_set_error(TG_ERR_INVALID, "tg_onnx_load: path is NULL");
    return NULL;
  }
  if (device && !*device) {
    tg_set_error(TG_ERR_INVALID, "tg_onnx_load: device is \"\" (NULL means the default device)");
    return NULL;
  }
  FileView fv;
  if (file_view_open(&fv, "tg_onnx_load", path, false) != TG_OK) return NULL;
  tg_onnx *m = onnx_load_mem("tg_onnx_load", path, fv.data, fv.len, device);
  file_view_close(&fv);
  return m;
}

/* ==== accessors ================================================================================= */

static const VInfo *vinfo_at(const tg_onnx *m, int i, bool out, const char *fn) {
  if (!m) {
    tg_set_error(TG_ERR_INVALID, "%s: the model is NULL", fn);
    return NULL;
  }
  int n = out ? m->noutputs : m->ninputs;
  if (i < 0 || i >= n) {
    tg_set_error(TG_ERR_INVALID, "%s: index %d is out of range (the model has %d %s)", fn, i, n,
                 out ? "outputs" : "inputs");
    return NULL;
  }
  return out ? &m->outputs[i] : &m->inputs[i];
}
int tg_onnx_input_count(const tg_onnx *m) { return m ? m->ninputs : -1; }
int tg_onnx_output_count(const tg_onnx *m) { return m ? m->noutputs : -1; }
const char *tg_onnx_input_name(const tg_onnx *m, int i) {
  const VInfo *v = vinfo_at(m, i, false, "tg_onnx_input_name");
  return v ? v->name : NULL;
}
const char *tg_onnx_output_name(const tg_onnx *m, int i) {
  const VInfo *v = vinfo_at(m, i, true, "tg_onnx_output_name");
  return v ? v->name : NULL;
}
tg_dtype tg_onnx_input_dtype(const tg_onnx *m, int i) {
  const VInfo *v = vinfo_at(m, i, false, "tg_onnx_input_dtype");
  return v ? v->dt : TG_DTYPE_DEFAULT;
}
tg_dtype tg_onnx_output_dtype(const tg_onnx *m, int i) {
  const VInfo *v = vinfo_at(m, i, true, "tg_onnx_output_dtype");
  return v ? v->dt : TG_DTYPE_DEFAULT;
}
static int vshape(const VInfo *v, int64_t *out, int cap) {
  if (!v) return -1;
  if (v->ndim < 0) return -2;
  for (int i = 0; i < v->ndim && out && i < cap; i++) out[i] = v->shape[i];
  return v->ndim;
}
int tg_onnx_input_shape(const tg_onnx *m, int i, int64_t *out, int cap) {
  return vshape(vinfo_at(m, i, false, "tg_onnx_input_shape"), out, cap);
}
int tg_onnx_output_shape(const tg_onnx *m, int i, int64_t *out, int cap) {
  return vshape(vinfo_at(m, i, true, "tg_onnx_output_shape"), out, cap);
}
const char *tg_onnx_input_dim_param(const tg_onnx *m, int i, int dim) {
  const VInfo *v = vinfo_at(m, i, false, "tg_onnx_input_dim_param");
  return v && dim >= 0 && dim < v->ndim ? v->dimparam[dim] : NULL;
}

/* ==== run ======================================================================================= */

static bool check_inputs(tg_onnx *m, const tg_tensor *in) {
  const char *pname[ONNX_MAX_DIMS * 4];
  int64_t pval[ONNX_MAX_DIMS * 4];
  int np = 0;
  for (int i = 0; i < m->ninputs; i++) {
    const VInfo *v = &m->inputs[i];
    if (!tg_valid(in[i])) {
      tg_set_error(TG_ERR_HANDLE, "tg_onnx_run: input %d ('%s') is not a valid tensor", i, v->name);
      return false;
    }
    tg_dtype dt = tg_dtype_of(in[i]);
    if (v->dt && dt != v->dt) {
      tg_set_error(TG_ERR_INVALID, "tg_onnx_run: input %d ('%s') is %s, the model expects %s (tg_cast it)", i,
                   v->name, tg_dtype_name(dt), tg_dtype_name(v->dt));
      return false;
    }
    if (v->ndim < 0) continue;
    int64_t shape[ONNX_MAX_DIMS];
    int nd = tg_ndim(in[i]);
    if (nd != v->ndim) {
      tg_set_error(TG_ERR_INVALID, "tg_onnx_run: input %d ('%s') has %d dims, the model expects %d", i,
                   v->name, nd, v->ndim);
      return false;
    }
    tg_shape(in[i], shape);
    for (int d = 0; d < nd; d++) {
      if (v->shape[d] >= 0 && !v->dimparam[d] && shape[d] != v->shape[d]) {
        tg_set_error(TG_ERR_INVALID,
                     "tg_onnx_run: input %d ('%s') has size %lld in dim %d, the model expects %lld", i,
                     v->name, (long long)shape[d], d, (long long)v->shape[d]);
        return false;
      }
      if (v->dimparam[d] && *v->dimparam[d]) {
        int k = 0;
        while (k < np && strcmp(pname[k], v->dimparam[d])) k++;
        if (k < np && pval[k] != shape[d]) {
          tg_set_error(TG_ERR_INVALID,
                       "tg_onnx_run: input %d ('%s') dim %d ('%s') is %lld but another input gave it %lld", i,
                       v->name, d, v->dimparam[d], (long long)shape[d], (long long)pval[k]);
          return false;
        }
        if (k == np && np < (int)(sizeof pval / sizeof pval[0]))
          pname[np] = v->dimparam[d], pval[np++] = shape[d];
      }
    }
  }
  return true;
}

/* had: the thread had an error before the node ran (it is kept) */
static bool bad_attr(bool had) {
  const Attr *a = tl_bad_attr;
  if (!a) return false;
  tl_bad_attr = NULL;
  if (had) return true;
  tg_clear_error(); /* the attribute is the cause of whatever the op's default then did */
  tg_set_error(TG_ERR_INVALID, "attribute '%s' is %s, expected %s (a malformed model?)", a->name,
               attr_type_names[a->type >= AT_UNDEF && a->type <= AT_OTHER ? a->type : AT_OTHER], tl_bad_want);
  return true;
}

static bool run_node(Run *r, const Node *n) {
  r->n = n;
  const OpDef *d = n->def;
  tl_bad_attr = NULL;
  bool had = tg_has_error();
  if (d->fold) {
    int f = d->fold(r, n);
    if (bad_attr(had) || f < 0) return false;
    if (f > 0) return true;
  }
  bool ok = d->fn(r, n);
  if (bad_attr(had)) return false;
  if (!ok) {
    if (!tg_has_error()) tg_set_error(TG_ERR_INVALID, "the op failed");
    return false;
  }
  for (int k = 0; k < n->nout; k++)
    if (n->out[k] >= 0 && !r->v[n->out[k]].t.id && !r->v[n->out[k]].h) {
      tg_set_error(TG_ERR_INVALID, "output %d was not produced", k);
      return false;
    }
  return true;
}

tg_status tg_onnx_run(tg_onnx *m, const tg_tensor *inputs, int nin, tg_tensor *outputs, int nout) {
  if (!m) return tg_set_error(TG_ERR_INVALID, "tg_onnx_run: the model is NULL");
  if (nin != m->ninputs || (nin && !inputs))
    return tg_set_error(TG_ERR_INVALID, "tg_onnx_run: the model takes %d input(s)%s%s%s, got %d", m->ninputs,
                        m->ninputs ? " (first: '" : "", m->ninputs ? m->inputs[0].name : "",
                        m->ninputs ? "')" : "", nin);
  if (nout != m->noutputs || !outputs)
    return tg_set_error(TG_ERR_INVALID, "tg_onnx_run: the model has %d output(s), got room for %d%s",
                        m->noutputs, nout, outputs ? "" : " (outputs is NULL)");
  for (int i = 0; i < nout; i++) outputs[i] = (tg_tensor){0};
  if (!check_inputs(m, inputs)) return tg_last_status();
  RV *v = calloc((size_t)m->nvals + 1, sizeof *v);
  if (!v) return tg_set_error(TG_ERR_RUNTIME, "tg_onnx_run: out of memory");
  for (int i = 0; i < m->nvals; i++)
    if (m->vals[i].kind == V_CONST) {
      v[i].t = m->consts[m->vals[i].ref].t;
      v[i].h = m->consts[m->vals[i].ref].h;
    }
  for (int i = 0; i < m->ninputs; i++) v[m->inputs[i].val].t = inputs[i];
  Run r = {.m = m, .v = v};
  tg_status st = TG_OK;
  tg_scope_begin();
  for (int k = 0; k < m->nnodes_run; k++) {
    int i = m->order[k];
    const Node *n = &m->nodes[i];
    if (!run_node(&r, n)) {
      char lbl[400];
      error_restate(TG_OK, NULL, "tg_onnx_run: %s", node_label(n, i, lbl, sizeof lbl));
      st = tg_last_status();
      if (st == TG_OK) st = TG_ERR_INVALID;
      break;
    }
  }
  for (int i = 0; st == TG_OK && i < nout; i++) {
    RV *o = &v[m->outputs[i].val];
    if (!o->t.id && o->h) o->t = host_tensor(m, o->h);
    outputs[i] = tg_detach(o->t);
    if (!tg_valid(outputs[i])) {
      error_restate(TG_OK, NULL, "tg_onnx_run: output '%s'", m->outputs[i].name);
      st = tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    }
  }
  if (st == TG_OK)
    for (int i = 0; i < nout; i++) tg_keep(outputs[i]);
  else
    for (int i = 0; i < nout; i++) outputs[i] = (tg_tensor){0};
  tg_scope_end();
  for (int i = 0; i < m->nvals; i++)
    if (v[i].own_h) host_free(v[i].h);
  free(v);
  return st;
}
