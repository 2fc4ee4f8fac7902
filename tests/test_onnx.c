/*
 * test_onnx.c -- tg_onnx_load / tg_onnx_run on models written here byte by byte (a small protobuf
 * writer): results of a tiny graph against values computed in C, a Shape -> Gather -> Unsqueeze ->
 * Concat -> Reshape chain run plain and inside tg_jit (the shape work must be host-folded: a jit
 * capture may not read tensor data), and the error paths: every truncation of a valid file, files
 * of other formats, varint overflow, wrong wire types, unsupported ops, undefined and duplicate
 * names, cycles, external data, wrong input count / dtype / shape. No handle may stay live.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tinygrad.h"

/* ---- protobuf writer ---- */
typedef struct {
  uint8_t *p;
  size_t n, cap;
} B;

static void b_put(B *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  if (n) memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void b_varint(B *b, uint64_t v) {
  do {
    uint8_t c = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) c |= 0x80;
    b_put(b, &c, 1);
  } while (v);
}
static void b_tag(B *b, int f, int wt) { b_varint(b, (uint64_t)f << 3 | (uint64_t)wt); }
static void b_int(B *b, int f, int64_t v) {
  b_tag(b, f, 0);
  b_varint(b, (uint64_t)v);
}
static void b_bytes(B *b, int f, const void *d, size_t n) {
  b_tag(b, f, 2);
  b_varint(b, n);
  b_put(b, d, n);
}
static void b_str(B *b, int f, const char *s) { b_bytes(b, f, s, strlen(s)); }
static void b_msg(B *b, int f, B *sub) { /* appends sub as field f and frees it */
  b_bytes(b, f, sub->p, sub->n);
  free(sub->p);
  *sub = (B){0};
}

/* TensorProto with raw_data */
static B tensor_raw(const char *name, int dtype, const int64_t *dims, int nd, const void *raw, size_t n) {
  B t = {0};
  for (int i = 0; i < nd; i++) b_int(&t, 1, dims[i]);
  b_int(&t, 2, dtype);
  b_str(&t, 8, name);
  b_bytes(&t, 9, raw, n);
  return t;
}
/* ValueInfoProto, float or int64; a negative dim is dim_param "batch" */
static B value_info(const char *name, int elem, const int64_t *dims, int nd) {
  B shape = {0}, tt = {0}, type = {0}, v = {0};
  for (int i = 0; i < nd; i++) {
    B d = {0};
    if (dims[i] < 0)
      b_str(&d, 2, "batch");
    else
      b_int(&d, 1, dims[i]);
    b_msg(&shape, 1, &d);
  }
  b_int(&tt, 1, elem);
  b_msg(&tt, 2, &shape);
  b_msg(&type, 1, &tt);
  b_str(&v, 1, name);
  b_msg(&v, 2, &type);
  return v;
}
static B node(const char *op, const char *name, const char *const *ins, int nin, const char *const *outs,
              int nout) {
  B n = {0};
  for (int i = 0; i < nin; i++) b_str(&n, 1, ins[i]);
  for (int i = 0; i < nout; i++) b_str(&n, 2, outs[i]);
  b_str(&n, 3, name);
  b_str(&n, 4, op);
  return n;
}
static void node_attr_int(B *n, const char *name, int64_t v) {
  B a = {0};
  b_str(&a, 1, name);
  b_int(&a, 3, v);
  b_int(&a, 20, 2);
  b_msg(n, 5, &a);
}
static B model(B *graph, int opset) {
  B m = {0}, op = {0};
  b_int(&m, 1, 8); /* ir_version */
  b_str(&m, 2, "test_onnx.c");
  b_str(&op, 1, "");
  b_int(&op, 2, opset);
  b_msg(&m, 8, &op);
  b_msg(&m, 7, graph); /* last: every truncation cuts the graph */
  return m;
}

static char onnx_dir[64];
static char *write_file(const char *name, const void *d, size_t n) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", onnx_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (n && fwrite(d, 1, n, f) != n) abort();
  fclose(f);
  return path;
}

/* y = relu(x @ W + b): x (2,3) input, W (3,4) raw_data, b (4,) float_data */
static const float Wv[12] = {1, -2, 3, 0.5f, -1, 2, 0.25f, -3, 0.5f, 1, -1, 2};
static const float bv[4] = {0.1f, -0.2f, 0.3f, -0.4f};
static B mlp_graph(const char *op2, bool with_out) {
  B g = {0}, t;
  const char *mm_in[] = {"x", "W"}, *mm_out[] = {"h"}, *add_in[] = {"h", "b"}, *add_out[] = {"a"},
             *r_in[] = {"a"}, *r_out[] = {"y"};
  t = node("MatMul", "mm", mm_in, 2, mm_out, 1);
  b_msg(&g, 1, &t);
  t = node("Add", "add", add_in, 2, add_out, 1);
  b_msg(&g, 1, &t);
  t = node(op2, "act", r_in, 1, r_out, 1);
  b_msg(&g, 1, &t);
  b_str(&g, 2, "mlp");
  t = tensor_raw("W", 1, (int64_t[]){3, 4}, 2, Wv, sizeof Wv);
  b_msg(&g, 5, &t);
  B bt = {0}; /* float_data, packed */
  b_int(&bt, 1, 4);
  b_int(&bt, 2, 1);
  b_bytes(&bt, 4, bv, sizeof bv);
  b_str(&bt, 8, "b");
  b_msg(&g, 5, &bt);
  t = value_info("x", 1, (int64_t[]){2, 3}, 2);
  b_msg(&g, 11, &t);
  if (with_out) {
    t = value_info("y", 1, (int64_t[]){2, 4}, 2);
    b_msg(&g, 12, &t);
  }
  return g;
}

TEST(mlp_matches_c) {
  BEGIN;
  B g = mlp_graph("Relu", true), m = model(&g, 13);
  char *path = write_file("mlp.onnx", m.p, m.n);
  tg_onnx *om = tg_onnx_load(path, NULL);
  CHECK_MSG(om != NULL, "%s", tg_last_error());
  if (om) {
    CHECK(tg_onnx_input_count(om) == 1 && tg_onnx_output_count(om) == 1);
    CHECK(!strcmp(tg_onnx_input_name(om, 0), "x") && !strcmp(tg_onnx_output_name(om, 0), "y"));
    CHECK(tg_onnx_input_dtype(om, 0) == TG_FLOAT32);
    int64_t s[4];
    CHECK(tg_onnx_input_shape(om, 0, s, 4) == 2 && s[0] == 2 && s[1] == 3);
    CHECK(tg_onnx_input_name(om, 1) == NULL);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_input_name", "out of range");
    float xv[6] = {1, 2, 3, -1, 0.5f, 2}, out[8];
    tg_tensor x = tg_from_data(xv, TG_SHAPE(2, 3), NULL), y;
    CHECK(tg_onnx_run(om, &x, 1, &y, 1) == TG_OK);
    CHECK(tg_data(y, out, sizeof out) == TG_OK);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 4; j++) {
        float acc = bv[j];
        for (int k = 0; k < 3; k++) acc += xv[i * 3 + k] * Wv[k * 4 + j];
        CHECK_CLOSE(out[i * 4 + j], acc > 0 ? acc : 0, 1e-6);
      }
    /* wrong count, dtype, shape */
    tg_tensor two[2] = {x, x};
    CHECK(tg_onnx_run(om, two, 2, &y, 1) != TG_OK);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "1 input");
    CHECK(tg_onnx_run(om, &x, 1, two, 2) != TG_OK);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "output");
    tg_tensor xi = tg_cast(x, TG_INT32);
    CHECK(tg_onnx_run(om, &xi, 1, &y, 1) != TG_OK);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "'x'", "int");
    tg_tensor xs = tg_zeros(TG_SHAPE(3, 3), NULL);
    CHECK(tg_onnx_run(om, &xs, 1, &y, 1) != TG_OK);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "'x'", "dim 0");
    CHECK(y.id == 0);
    tg_onnx_free(om);
  }
  free(m.p);
  END;
}

/* Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape: x (batch, 2, 3) -> (batch, 6), then * 2 */
static B shape_graph(void) {
  B g = {0}, t;
  const char *n1i[] = {"x"}, *n1o[] = {"s"}, *n2i[] = {"s", "zero"}, *n2o[] = {"b"}, *n3i[] = {"b", "ax0"},
             *n3o[] = {"b1"}, *n4i[] = {"b1", "minus1"}, *n4o[] = {"shp"}, *n5i[] = {"x", "shp"},
             *n5o[] = {"r"}, *n6i[] = {"r", "two"}, *n6o[] = {"y"};
  /* listed out of order on purpose: the loader sorts them */
  t = node("Mul", "scale", n6i, 2, n6o, 1);
  b_msg(&g, 1, &t);
  t = node("Shape", "shape", n1i, 1, n1o, 1);
  b_msg(&g, 1, &t);
  t = node("Gather", "gather", n2i, 2, n2o, 1);
  node_attr_int(&t, "axis", 0);
  b_msg(&g, 1, &t);
  t = node("Unsqueeze", "unsq", n3i, 2, n3o, 1);
  b_msg(&g, 1, &t);
  t = node("Concat", "concat", n4i, 2, n4o, 1);
  node_attr_int(&t, "axis", 0);
  b_msg(&g, 1, &t);
  t = node("Reshape", "reshape", n5i, 2, n5o, 1);
  b_msg(&g, 1, &t);
  int64_t zero = 0, ax0 = 0, m1 = -1;
  float two = 2.0f;
  t = tensor_raw("zero", 7, NULL, 0, &zero, 8);
  b_msg(&g, 5, &t);
  t = tensor_raw("ax0", 7, (int64_t[]){1}, 1, &ax0, 8);
  b_msg(&g, 5, &t);
  t = tensor_raw("minus1", 7, (int64_t[]){1}, 1, &m1, 8);
  b_msg(&g, 5, &t);
  t = tensor_raw("two", 1, NULL, 0, &two, 4);
  b_msg(&g, 5, &t);
  t = value_info("x", 1, (int64_t[]){-1, 2, 3}, 3);
  b_msg(&g, 11, &t);
  t = value_info("y", 1, (int64_t[]){-1, 6}, 2);
  b_msg(&g, 12, &t);
  return g;
}

static tg_status jit_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                        void *user) {
  (void)args;
  (void)nargs;
  return tg_onnx_run((tg_onnx *)user, in, nin, out, nout);
}

TEST(shape_chain_plain_and_jit) {
  BEGIN;
  B g = shape_graph(), m = model(&g, 13);
  char *path = write_file("shape.onnx", m.p, m.n);
  tg_onnx *om = tg_onnx_load(path, NULL);
  CHECK_MSG(om != NULL, "%s", tg_last_error());
  if (om) {
    CHECK(!strcmp(tg_onnx_input_dim_param(om, 0, 0), "batch"));
    int64_t s[3];
    CHECK(tg_onnx_input_shape(om, 0, s, 3) == 3 && s[0] == -1 && s[2] == 3);
    for (int batch = 1; batch <= 3; batch++) {
      tg_tensor x = tg_arange(0, 6.0 * batch, 1, TG_OPTS(.dtype = TG_FLOAT32)), y;
      x = tg_contiguous(tg_reshape(x, TG_SHAPE(batch, 2, 3)));
      CHECK(tg_onnx_run(om, &x, 1, &y, 1) == TG_OK);
      int64_t ys[2];
      CHECK(tg_shape(y, ys) == 2 && ys[0] == batch && ys[1] == 6);
      float out[18];
      CHECK(tg_data(y, out, sizeof out) == TG_OK);
      for (int i = 0; i < 6 * batch; i++) CHECK_CLOSE(out[i], 2.0 * i, 0);
    }
    tg_jit *j = tg_jit_new(jit_fn, 1, om);
    for (int it = 0; it < 4; it++) {
      tg_tensor x = tg_contiguous(tg_add_s(tg_zeros(TG_SHAPE(2, 2, 3), NULL), (double)it)), y;
      CHECK(tg_realize(x) == TG_OK);
      tg_status st = tg_jit_call(j, &x, 1, NULL, 0, &y);
      CHECK_MSG(st == TG_OK, "jit call %d: %s", it, tg_last_error());
      if (st != TG_OK) {
        tg_clear_error();
        break;
      }
      float out[12];
      CHECK(tg_data(y, out, sizeof out) == TG_OK);
      for (int i = 0; i < 12; i++) CHECK_CLOSE(out[i], 2.0 * it, 0);
    }
    tg_jit_free(j);
    tg_onnx_free(om);
  }
  free(m.p);
  END;
}

static void expect_load_error(const char *name, const void *d, size_t n, const char *needle) {
  char *path = write_file(name, d, n);
  tg_onnx *om = tg_onnx_load(path, NULL);
  CHECK_MSG(om == NULL, "%s loaded", name);
  if (om) tg_onnx_free(om);
  CHECK_MSG(tg_last_status() == TG_ERR_IO, "%s: status %d: %s", name, (int)tg_last_status(), tg_last_error());
  CHECK_STR_CONTAINS(tg_last_error(), "tg_onnx_load");
  if (needle) CHECK_STR_CONTAINS(tg_last_error(), needle);
  tg_clear_error();
}

TEST(truncations_and_other_formats) {
  BEGIN;
  B g = mlp_graph("Relu", true), m = model(&g, 13);
  for (size_t len = 0; len < m.n; len++) expect_load_error("trunc.onnx", m.p, len, NULL);
  expect_load_error("empty.onnx", "", 0, "empty");
  expect_load_error("gguf.onnx", "GGUF\x03\0\0\0\0\0\0\0\0\0\0\0", 16, NULL);
  expect_load_error("zip.onnx", "PK\x03\x04\x14\0\0\0\x08\0", 10, NULL);
  expect_load_error("text.onnx", "hello world, not a model\n", 25, NULL);
  uint8_t big[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  expect_load_error("varint.onnx", big, sizeof big, "varint");
  uint8_t wt[] = {0x38, 0x05}; /* graph (field 7) as a varint */
  expect_load_error("wiretype.onnx", wt, sizeof wt, "ModelProto.graph");
  uint8_t grp[] = {0x3b}; /* field 7, group start */
  expect_load_error("group.onnx", grp, sizeof grp, "wire type");
  uint8_t huge[] = {0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f}; /* graph of 4 GiB */
  expect_load_error("huge.onnx", huge, sizeof huge, "past the end");
  CHECK(tg_onnx_load(onnx_dir, NULL) == NULL); /* a directory */
  CHECK_ERR(TG_ERR_IO, "tg_onnx_load");
  CHECK(tg_onnx_load("/nonexistent/m.onnx", NULL) == NULL);
  CHECK_ERR(TG_ERR_IO, "tg_onnx_load");
  free(m.p);
  END;
}

TEST(graph_errors) {
  BEGIN;
  /* unsupported op */
  B g = mlp_graph("NonZero", true), m = model(&g, 13);
  expect_load_error("unsup.onnx", m.p, m.n, "'NonZero' is not supported");
  free(m.p);
  g = mlp_graph("Relu", true);
  const char *ui[] = {"nowhere"}, *uo[] = {"z"};
  B t = node("Relu", "orphan", ui, 1, uo, 1);
  b_msg(&g, 1, &t);
  m = model(&g, 13);
  expect_load_error("undef.onnx", m.p, m.n, "'nowhere' is never defined");
  free(m.p);
  g = mlp_graph("Relu", true);
  const char *di[] = {"x"}, *dout[] = {"h"};
  t = node("Neg", "dup", di, 1, dout, 1);
  b_msg(&g, 1, &t);
  m = model(&g, 13);
  expect_load_error("dup.onnx", m.p, m.n, "already defined");
  free(m.p);
  g = mlp_graph("Relu", true);
  const char *c1i[] = {"c2"}, *c1o[] = {"c1"}, *c2i[] = {"c1"}, *c2o[] = {"c2"};
  t = node("Neg", "cyc1", c1i, 1, c1o, 1);
  b_msg(&g, 1, &t);
  t = node("Neg", "cyc2", c2i, 1, c2o, 1);
  b_msg(&g, 1, &t);
  m = model(&g, 13);
  expect_load_error("cycle.onnx", m.p, m.n, "cycle");
  free(m.p);
  g = mlp_graph("Relu", false); /* no graph output */
  m = model(&g, 13);
  expect_load_error("noout.onnx", m.p, m.n, "no outputs");
  free(m.p);
  /* duplicate initializer */
  g = mlp_graph("Relu", true);
  t = tensor_raw("W", 1, (int64_t[]){1}, 1, Wv, 4);
  b_msg(&g, 5, &t);
  m = model(&g, 13);
  expect_load_error("dupinit.onnx", m.p, m.n, "defined twice");
  free(m.p);
  /* dims that do not match the data, and external data */
  g = mlp_graph("Relu", true);
  t = tensor_raw("bad", 1, (int64_t[]){1000000, 1000000}, 2, Wv, sizeof Wv);
  b_msg(&g, 5, &t);
  m = model(&g, 13);
  expect_load_error("dims.onnx", m.p, m.n, "elements");
  free(m.p);
  g = mlp_graph("Relu", true);
  t = (B){0};
  b_int(&t, 1, 4);
  b_int(&t, 2, 1);
  b_str(&t, 8, "ext");
  b_int(&t, 14, 1);
  b_msg(&g, 5, &t);
  m = model(&g, 13);
  expect_load_error("ext.onnx", m.p, m.n, "external");
  free(m.p);
  CHECK(tg_live_count() == tt_live0);
  END;
}

/* Graph g (its nodes and initializers written) with input x, float32 (2, 3), and output y, as an
 * opset-13 model in file `name`, loaded (NULL, with a failed check, if it does not load). */
static tg_onnx *load_x23_graph(B *g, const char *name) {
  B t = value_info("x", 1, (int64_t[]){2, 3}, 2);
  b_msg(g, 11, &t);
  t = value_info("y", 1, NULL, 0);
  b_msg(g, 12, &t);
  B m = model(g, 13);
  char *path = write_file(name, m.p, m.n);
  free(m.p);
  tg_onnx *om = tg_onnx_load(path, NULL);
  CHECK_MSG(om != NULL, "%s", tg_last_error());
  return om;
}

TEST(run_error_names_node) {
  BEGIN;
  /* a Reshape to an impossible shape fails at run time with the node named */
  B g = {0}, t;
  const char *ri[] = {"x", "shp"}, *ro[] = {"y"};
  t = node("Reshape", "bad_reshape", ri, 2, ro, 1);
  b_msg(&g, 1, &t);
  int64_t shp[2] = {4, 4};
  t = tensor_raw("shp", 7, (int64_t[]){2}, 1, shp, sizeof shp);
  b_msg(&g, 5, &t);
  tg_onnx *om = load_x23_graph(&g, "reshape.onnx");
  if (om) {
    tg_tensor x = tg_zeros(TG_SHAPE(2, 3), NULL), y;
    CHECK(tg_onnx_run(om, &x, 1, &y, 1) != TG_OK);
    CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "bad_reshape", "Reshape");
    tg_onnx_free(om);
  }
  END;
}

/* An attribute of the wrong type is the node's error, not a silent fall back to the default: a
 * Softmax over axis 0 written with "axis" as a FLOAT would otherwise run over the last axis. */
TEST(wrongly_typed_attribute_is_an_error) {
  BEGIN;
  const char *types[] = {"float", "string"};
  for (int k = 0; k < 2; k++) {
    B g = {0}, t, a = {0};
    const char *si[] = {"x"}, *so[] = {"y"};
    t = node("Softmax", "sm", si, 1, so, 1);
    b_str(&a, 1, "axis");
    if (k == 0) {
      float f = 0.0f;
      b_tag(&a, 2, 5); /* AttributeProto.f, fixed32 */
      b_put(&a, &f, 4);
      b_int(&a, 20, 1);
    } else {
      b_str(&a, 4, "0");
      b_int(&a, 20, 3);
    }
    b_msg(&t, 5, &a);
    b_msg(&g, 1, &t);
    tg_onnx *om = load_x23_graph(&g, "attr_type.onnx");
    if (om) {
      tg_tensor x = tg_zeros(TG_SHAPE(2, 3), NULL), y = {0};
      CHECK_MSG(tg_onnx_run(om, &x, 1, &y, 1) != TG_OK, "axis as a %s ran", types[k]);
      CHECK_ERR(TG_ERR_INVALID, "tg_onnx_run", "'sm'", "attribute 'axis' is", "expected INT");
      tg_clear_error();
      tg_onnx_free(om);
    }
  }
  END;
}

int main(void) {
  snprintf(onnx_dir, sizeof onnx_dir, "/tmp/tg_onnx_XXXXXX");
  if (!mkdtemp(onnx_dir)) return 1;
  int rc = RUN_TESTS();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", onnx_dir);
  if (system(cmd) != 0) rc = 1;
  if (tg_live_count() != 0) {
    fprintf(stderr, "%zu handles still live at exit\n", (size_t)tg_live_count());
    rc = 1;
  }
  return rc;
}
