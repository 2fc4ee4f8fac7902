/* test_export.c -- tg_jit_export: a captured TinyJit written as C, compiled here without
 * libtinygrad (gcc, clang, g++; -Wall -Wextra -Werror; ASan/UBSan), run, and compared with the
 * library's own replay bit for bit; its refusals; the weights-file variant and its checks. */
#include <math.h>
#include <stdarg.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

#include "test.h"

static bool write_text_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}
/* Does the file at path hold exactly text? */
static bool file_is(const char *path, const char *text) {
  char buf[256] = {0};
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  return n == strlen(text) && memcmp(buf, text, n) == 0;
}
/* Files in dir whose name has ".tmp." in it (a save's temporary file left behind). */
static int count_temp_files(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

/* The runtime's kernel flags (ops_cpu.c): the same kernels compiled the same way give the same bits. */
#define NATIVE "-O2 -march=native -ffp-contract=fast -fno-math-errno -fwrapv"

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Runs a shell command (output into a log that is shown on failure); returns its exit status. */
static int sh(const char *fmt, ...) {
  char cmd[4096], full[4800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  static char log[600];
  if (!log[0]) snprintf(log, sizeof log, "%s/sh.log", tmpdir());
  snprintf(full, sizeof full, "(%s) > '%s' 2>&1", cmd, log);
  int rc = system(full);
  rc = rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  if (rc != 0) {
    fprintf(stderr, "  command failed (%d): %s\n", rc, cmd);
    char show[700];
    snprintf(show, sizeof show, "head -c 3000 '%s' >&2", log);
    if (system(show) != 0) fprintf(stderr, "  (no log)\n");
  }
  return rc;
}

static bool write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(p, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}


/* A driver for an exported entry point: reads in<i>.bin, calls it twice (the second call must give
 * the same bytes: the arena is reused), writes out<i>.bin. With a weights file it loads it first;
 * `driver load <file>` only loads and prints the result code and message. */
static void write_driver(const char *path, const char *name, const char *const *in_t, int nin, const char *const *out_t, int nout, bool load) {
  char N[64];
  size_t i = 0;
  for (; name[i]; i++) N[i] = (char)(name[i] >= 'a' && name[i] <= 'z' ? name[i] - 32 : name[i]);
  N[i] = 0;
  FILE *f = fopen(path, "w");
  fprintf(f, "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include \"%s.h\"\n", name);
  fprintf(f, "static void *rd(const char *dir, const char *n, size_t bytes) {\n"
             "  char p[1024]; snprintf(p, sizeof p, \"%%s/%%s\", dir, n);\n"
             "  void *b = malloc(bytes ? bytes : 1); FILE *f = fopen(p, \"rb\");\n"
             "  if (!f || fread(b, 1, bytes, f) != bytes) { fprintf(stderr, \"cannot read %%s\\n\", p); exit(2); }\n"
             "  fclose(f); return b;\n}\n");
  fprintf(f, "int main(int argc, char **argv) {\n  if (argc < 3) return 2;\n");
  if (load) {
    fprintf(f, "  if (!strcmp(argv[1], \"load\")) { int rc = %s_load(argv[2]); printf(\"%%d %%s\\n\", rc, %s_last_error()); %s_free(); return 0; }\n", name, name, name);
    fprintf(f, "  { int rc = %s(", name);
    for (int k = 0; k < nin + nout; k++) fprintf(f, "%sNULL", k ? ", " : "");
    fprintf(f, "); if (rc != %s_ERR_ARG) return 4; }\n", N);
    fprintf(f, "  if (%s_load(argv[1]) != 0) { fprintf(stderr, \"%%s\\n\", %s_last_error()); return 5; }\n", name, name);
  }
  for (int k = 0; k < nin; k++) fprintf(f, "  %s *in%d = (%s *)rd(argv[2], \"in%d.bin\", %s_IN%d_BYTES);\n", in_t[k], k, in_t[k], k, N, k);
  for (int k = 0; k < nout; k++)
    fprintf(f, "  %s *out%d = (%s *)malloc(%s_OUT%d_BYTES + 1), *again%d = (%s *)malloc(%s_OUT%d_BYTES + 1);\n", out_t[k], k, out_t[k], N, k, k, out_t[k], N, k);
  for (int pass = 0; pass < 2; pass++) {
    fprintf(f, "  if (%s(", name);
    for (int k = 0; k < nin; k++) fprintf(f, "%sin%d", k ? ", " : "", k);
    for (int k = 0; k < nout; k++) fprintf(f, "%s%s%d", nin || k ? ", " : "", pass ? "again" : "out", k);
    fprintf(f, ") != %s_OK) { fprintf(stderr, \"%%s\\n\", %s_last_error()); return 3; }\n", N, name);
  }
  for (int k = 0; k < nout; k++) {
    fprintf(f, "  if (memcmp(out%d, again%d, %s_OUT%d_BYTES)) { fprintf(stderr, \"second call differs\\n\"); return 6; }\n", k, k, N, k);
    fprintf(f, "  { char p[1024]; snprintf(p, sizeof p, \"%%s/out%d.bin\", argv[2]); FILE *f = fopen(p, \"wb\");\n"
               "    if (!f || fwrite(out%d, 1, %s_OUT%d_BYTES, f) != %s_OUT%d_BYTES) return 7;\n    fclose(f); }\n",
            k, k, N, k, N, k);
    fprintf(f, "  free(out%d); free(again%d);\n", k, k);
  }
  for (int k = 0; k < nin; k++) fprintf(f, "  free(in%d);\n", k);
  if (load) fprintf(f, "  %s_free();\n", name);
  fprintf(f, "  return 0;\n}\n");
  fclose(f);
}

/* Compares the file the exported program wrote with the library's output, byte for byte. */
static bool same_bytes(const char *path, tg_tensor t, const char *what) {
  size_t n = 0, want = (size_t)tg_numel(t) * tg_dtype_itemsize(tg_dtype_of(t));
  void *got = tt_read_file(path, &n);
  void *ref = malloc(want + 1);
  bool ok = got && tg_data(t, ref, want) == TG_OK && n == want && !memcmp(got, ref, want);
  if (!ok) {
    fprintf(stderr, "  %s: %s differs from the library's output (%zu bytes, want %zu)\n", what, path, n, want);
    if (got && n == want && tg_dtype_of(t) == TG_FLOAT32)
      for (size_t i = 0; i < want / 4; i++)
        if (((float *)got)[i] != ((float *)ref)[i]) {
          fprintf(stderr, "  first difference at %zu: %.9g vs %.9g\n", i, ((float *)got)[i], ((float *)ref)[i]);
          break;
        }
  }
  free(got), free(ref);
  return ok;
}

typedef struct {
  const char *name;
  const char *const *in_t, *const *out_t;
  int nin, nout;
  const tg_tensor *in, *out; /* inputs and the library's replay outputs for them (kernels built by gcc: main sets CC) */
  const tg_tensor *out_clang; /* the same replay with the kernels built by clang */
} Case;

/* The library's replay of a capture of fn on x with its kernels compiled by `cc` (the CC setting is
 * read at each compile): outputs in out, valid until the returned jit is freed. gcc and clang fuse
 * a*b+c into FMAs at different places under -ffp-contract=fast, so one kernel source compiled by each
 * may differ in the last bit: each build of an exported file is compared with the library running
 * kernels from the same compiler. */
static tg_jit *replay_with_cc(const char *cc, tg_jit_fn fn, int nout, void *u, bool prune, tg_tensor x, tg_tensor *out) {
  tg_context_begin();
  CHECK(tg_context_set("CC", cc) == TG_OK);
  tg_jit *j = tg_jit_new_opts(fn, nout, u, TG_JIT_OPTS(.prune = prune));
  /* each call gets a new buffer holding x's values: a node already realized (the first jit's last
   * call computed these outputs) would run no kernel at all */
  int64_t shape[8];
  int nd = tg_shape(x, shape);
  size_t nb = (size_t)tg_numel(x) * tg_dtype_itemsize(tg_dtype_of(x));
  void *host = malloc(nb);
  CHECK(nd > 0 && tg_data(x, host, nb) == TG_OK);
  for (int call = 0; call < 3; call++) {
    tg_tensor xi = tg_from_data(host, shape, nd, TG_OPTS(.dtype = tg_dtype_of(x)));
    tg_status st = tg_jit_call(j, &xi, 1, NULL, 0, out);
    CHECK_MSG(st == TG_OK, "%s", tg_last_error());
  }
  free(host);
  for (int k = 0; k < nout; k++) CHECK(tg_realize(out[k]) == TG_OK);
  tg_context_end();
  return j;
}

/* Exports j under case c's name into dir, compiles it with each compiler and runs it. */
static void export_compile_run(tg_jit *j, const Case *c, const char *dir, const char *wpath) {
  char src[600], hdr[600];
  snprintf(src, sizeof src, "%s/%s.c", dir, c->name);
  snprintf(hdr, sizeof hdr, "%s/%s.h", dir, c->name);
  CHECK(sh("mkdir -p '%s'", dir) == 0);
  tg_status st = tg_jit_export(j, src, TG_JIT_EXPORT_OPTS(.name = c->name, .weights_path = wpath));
  CHECK_MSG(st == TG_OK, "%s", tg_last_error());
  if (st != TG_OK) return;
  tg_clear_error();
  /* the header and source say what they are */
  size_t n = 0;
  char *h = tt_read_file(hdr, &n);
  CHECK(h && strstr(h, "Fixed shapes") && strstr(h, "_IN0_SHAPE") && strstr(h, "TG_EXPORT_THREADS"));
  free(h);
  char *s = tt_read_file(src, &n);
  CHECK(s && !strstr(s, "tinygrad.h") && !strstr(s, "dlopen"));
  free(s);
  for (int k = 0; k < c->nin; k++) {
    char p[700];
    snprintf(p, sizeof p, "%s/in%d.bin", dir, k);
    size_t nb = (size_t)tg_numel(c->in[k]) * tg_dtype_itemsize(tg_dtype_of(c->in[k]));
    void *buf = malloc(nb);
    CHECK(tg_data(c->in[k], buf, nb) == TG_OK && write_file(p, buf, nb));
    free(buf);
  }
  char drv[700];
  snprintf(drv, sizeof drv, "%s/main.c", dir);
  write_driver(drv, c->name, c->in_t, c->nin, c->out_t, c->nout, wpath != NULL);
  const char *warg = wpath ? wpath : "-";
  /* warning-free under the plain flags, C and C++ */
  CHECK(sh("cd '%s' && gcc -std=c11 -O2 -Wall -Wextra -Werror -c %s.c -o plain-gcc.o", dir, c->name) == 0);
  CHECK(sh("cd '%s' && clang -std=c11 -O2 -Wall -Wextra -Werror -c %s.c -o plain-clang.o", dir, c->name) == 0);
  CHECK(sh("cd '%s' && g++ -x c++ -std=c++17 -O2 -Wall -Wextra -Werror -c %s.c -o plain-gxx.o", dir, c->name) == 0);
  CHECK(sh("cd '%s' && gcc -std=c11 -O2 -Wall -Wextra -Werror -DTG_EXPORT_THREADS -c %s.c -o plain-thr.o", dir, c->name) == 0);
  static const char *const builds[][2] = {
      {"gcc", "gcc -std=c11 " NATIVE " -Wall -Wextra -Werror"},
      {"clang", "clang -std=c11 " NATIVE " -Wall -Wextra -Werror"},
      {"gxx", "g++ -x c++ -std=c++17 " NATIVE " -Wall -Wextra -Werror"},
      {"threads", "gcc -std=c11 " NATIVE " -Wall -Wextra -Werror -DTG_EXPORT_THREADS -pthread"},
      {"asan", "gcc -std=c11 " NATIVE " -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"},
  };
  for (size_t b = 0; b < sizeof builds / sizeof builds[0]; b++) {
    /* no libtinygrad: only the two C files, libc and libm */
    if (sh("cd '%s' && %s -o prog-%s %s.c main.c -lm", dir, builds[b][1], builds[b][0], c->name) != 0) {
      CHECK_MSG(0, "%s: %s build failed", c->name, builds[b][0]);
      continue;
    }
    CHECK(sh("cd '%s' && rm -f out*.bin && THREADS=3 ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 ./prog-%s '%s' .", dir,
             builds[b][0], warg) == 0);
    for (int o = 0; o < c->nout; o++) {
      char p[700], what[128];
      snprintf(p, sizeof p, "%s/out%d.bin", dir, o);
      snprintf(what, sizeof what, "%s (%s)", c->name, builds[b][0]);
      CHECK(same_bytes(p, (strcmp(builds[b][0], "clang") ? c->out : c->out_clang)[o], what));
    }
  }
}

/* ---- a small MLP ---- */

typedef struct {
  tg_nn_linear l1, l2;
} Mlp;

static tg_status mlp_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  Mlp *m = u;
  out[0] = tg_nn_linear_forward(&m->l2, tg_relu(tg_nn_linear_forward(&m->l1, in[0])));
  return TG_OK;
}

static tg_tensor rand_input(const int64_t *shape, int ndim, uint64_t seed) {
  tg_manual_seed(seed);
  tg_tensor x = tg_contiguous(tg_randn(shape, ndim, NULL));
  tg_realize(x);
  return x;
}

static void run_mlp(bool prune, const char *dir, const char *wpath) {
  BEGIN;
  tg_manual_seed(7);
  Mlp m;
  CHECK(tg_nn_linear_init(&m.l1, 16, 32, true) == TG_OK && tg_nn_linear_init(&m.l2, 32, 10, true) == TG_OK);
  tg_jit *j = tg_jit_new_opts(mlp_fn, 1, &m, TG_JIT_OPTS(.prune = prune));
  tg_tensor out;
  for (int call = 0; call < 3; call++) {
    tg_tensor x = rand_input(TG_SHAPE(8, 16), 100 + (uint64_t)call);
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  }
  tg_tensor x = rand_input(TG_SHAPE(8, 16), 555);
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  tg_tensor out_clang;
  tg_jit *jc = replay_with_cc("clang", mlp_fn, 1, &m, prune, x, &out_clang);
  static const char *const ft[] = {"float"};
  Case c = {"mlp", ft, ft, 1, 1, &x, &out, &out_clang};
  export_compile_run(j, &c, dir, wpath);
  tg_jit_free(jc);
  tg_jit_free(j);
  tg_nn_linear_free(&m.l1), tg_nn_linear_free(&m.l2);
  END;
}

TEST(export_mlp_bit_exact) { run_mlp(false, tpath("mlp"), NULL); }
TEST(export_mlp_pruned_bit_exact) { run_mlp(true, tpath("mlp-pruned"), NULL); }

/* ---- a batch size chosen per call (a symbolic first dim) ---- */

#define SB_MAX 24
/* The MLP on the first n rows of x (SB_MAX, 16): the input is the (batch, 16) view of a tensor of
 * those n rows, batch bound to n. One capture serves every n. */
static tg_status sym_call(tg_jit *j, tg_symvar bv, const float *x, int n, tg_tensor *out) {
  tg_tensor xn = tg_from_data(x, TG_SHAPE(n, 16), NULL);
  tg_symvar b = tg_var_bind(bv, n);
  tg_tensor in = tg_shrink(xn, TG_SHAPE(0, tg_sym(b, 0), 0, 16));
  tg_status st = tg_realize(xn);
  if (st == TG_OK) st = tg_jit_call_vars(j, &in, 1, &b, 1, NULL, 0, out);
  return st;
}

TEST(export_symbolic_batch) {
  BEGIN;
  const char *dir = tpath("mlpb");
  tg_manual_seed(17);
  Mlp m;
  CHECK(tg_nn_linear_init(&m.l1, 16, 32, true) == TG_OK && tg_nn_linear_init(&m.l2, 32, 10, true) == TG_OK);
  tg_symvar bv = tg_variable("batch", 1, SB_MAX);
  float x[SB_MAX * 16];
  for (int i = 0; i < SB_MAX * 16; i++) x[i] = (float)sin(i * 0.37) * 1.5f;
  tg_jit *j = tg_jit_new(mlp_fn, 1, &m);
  tg_tensor out;
  CHECK_MSG(sym_call(j, bv, x, 5, &out) == TG_OK && sym_call(j, bv, x, 7, &out) == TG_OK, "%s", tg_last_error());
  CHECK(tg_jit_captured_kernels(j) > 0);
  /* the library's replays at the sizes the exported program will run */
  static const int ns[] = {1, 3, SB_MAX, 13};
  float ref[4][SB_MAX * 10];
  for (int k = 0; k < 4; k++) {
    CHECK_MSG(sym_call(j, bv, x, ns[k], &out) == TG_OK, "%s", tg_last_error());
    int64_t shp[2] = {0};
    CHECK(tg_shape(out, shp) == 2 && shp[0] == ns[k] && shp[1] == 10);
    CHECK(tg_data(out, ref[k], sizeof(float) * 10 * (size_t)ns[k]) == TG_OK);
  }
  char src[700], hdr[700];
  snprintf(src, sizeof src, "%s/mlpb.c", dir);
  snprintf(hdr, sizeof hdr, "%s/mlpb.h", dir);
  CHECK(sh("mkdir -p '%s'", dir) == 0);
  CHECK_MSG(tg_jit_export(j, src, TG_JIT_EXPORT_OPTS(.name = "mlpb")) == TG_OK, "%s", tg_last_error());
  size_t hn = 0;
  char *h = tt_read_file(hdr, &hn);
  CHECK(h && strstr(h, "int mlpb(int batch, const float *in0, float *out0)") && strstr(h, "batch in [1, 24]") &&
        strstr(h, "MLPB_IN0_BYTES(batch)") && strstr(h, "MLPB_ERR_RANGE") && strstr(h, "MLPB_OK (0)") &&
        !strstr(h, "Fixed shapes"));
  free(h);
  char xb[700];
  snprintf(xb, sizeof xb, "%s/x.bin", dir);
  CHECK(write_file(xb, x, sizeof x));
  /* the driver gives each call arrays of exactly its rows (ASan sees any access past them) */
  char drv[700];
  snprintf(drv, sizeof drv, "%s/main.c", dir);
  static const char driver[] =
      "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include \"mlpb.h\"\n"
      "int main(int argc, char **argv) {\n"
      "  static float x[MLPB_IN0_DIM0_MAX * MLPB_IN0_DIM1];\n"
      "  FILE *f = fopen(\"x.bin\", \"rb\");\n"
      "  if (!f || fread(x, 1, sizeof x, f) != sizeof x) return 2;\n"
      "  fclose(f);\n"
      "  float dummy[MLPB_OUT0_DIM1];\n"
      "  if (mlpb(0, x, dummy) != MLPB_ERR_RANGE || !strstr(mlpb_last_error(), \"batch = 0\")) return 8;\n"
      "  if (mlpb(MLPB_BATCH_MAX + 1, x, dummy) != MLPB_ERR_RANGE) return 9;\n"
      "  for (int a = 1; a < argc; a++) {\n"
      "    int n = atoi(argv[a]);\n"
      "    float *in = (float *)malloc(MLPB_IN0_BYTES(n)), *out = (float *)malloc(MLPB_OUT0_BYTES(n));\n"
      "    memcpy(in, x, MLPB_IN0_BYTES(n));\n"
      "    if (mlpb(n, in, out) != MLPB_OK) { fprintf(stderr, \"%s\\n\", mlpb_last_error()); return 3; }\n"
      "    char p[64];\n"
      "    snprintf(p, sizeof p, \"out%d.bin\", n);\n"
      "    f = fopen(p, \"wb\");\n"
      "    if (!f || fwrite(out, 1, MLPB_OUT0_BYTES(n), f) != MLPB_OUT0_BYTES(n)) return 7;\n"
      "    fclose(f);\n"
      "    free(in), free(out);\n"
      "  }\n"
      "  return 0;\n}\n";
  CHECK(write_file(drv, driver, sizeof driver - 1));
  CHECK(sh("cd '%s' && clang -std=c11 -O2 -Wall -Wextra -Werror -c mlpb.c -o plain-clang.o", dir) == 0);
  CHECK(sh("cd '%s' && g++ -x c++ -std=c++17 -O2 -Wall -Wextra -Werror -c mlpb.c -o plain-gxx.o", dir) == 0);
  static const char *const builds[][2] = {
      {"gcc", "gcc -std=c11 " NATIVE " -Wall -Wextra -Werror"},
      {"threads", "gcc -std=c11 " NATIVE " -Wall -Wextra -Werror -DTG_EXPORT_THREADS -pthread"},
      {"asan", "gcc -std=c11 " NATIVE " -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"},
  };
  for (size_t b = 0; b < sizeof builds / sizeof builds[0]; b++) {
    if (sh("cd '%s' && %s -o prog-%s mlpb.c main.c -lm", dir, builds[b][1], builds[b][0]) != 0) {
      CHECK_MSG(0, "%s build failed", builds[b][0]);
      continue;
    }
    CHECK(sh("cd '%s' && rm -f out*.bin && THREADS=2 ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 ./prog-%s 1 3 24 13", dir,
             builds[b][0]) == 0);
    for (int k = 0; k < 4; k++) {
      char p[800];
      snprintf(p, sizeof p, "%s/out%d.bin", dir, ns[k]);
      size_t n = 0;
      void *got = tt_read_file(p, &n);
      CHECK_MSG(got && n == sizeof(float) * 10 * (size_t)ns[k] && !memcmp(got, ref[k], n),
                "%s, batch %d: the exported program's output differs from the library's replay", builds[b][0], ns[k]);
      free(got);
    }
  }
  tg_jit_free(j);
  tg_nn_linear_free(&m.l1), tg_nn_linear_free(&m.l2);
  END;
}

static tg_status rowsum_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_sum(in[0], TG_AXES(1), false);
  return TG_OK;
}

/* a symbolic dim past the first would need the caller's array padded to the max: refused */
TEST(export_symbolic_inner_dim_refused) {
  BEGIN;
  tg_symvar v = tg_variable("cols", 1, 12);
  tg_tensor x = tg_contiguous(tg_ones(TG_SHAPE(3, 12), NULL));
  CHECK(tg_realize(x) == TG_OK);
  tg_jit *j = tg_jit_new(rowsum_fn, 1, NULL);
  tg_tensor out;
  for (int n = 4; n < 7; n++) {
    tg_symvar b = tg_var_bind(v, n);
    tg_tensor in = tg_shrink(x, TG_SHAPE(0, 3, 0, tg_sym(b, 0)));
    CHECK_MSG(tg_jit_call_vars(j, &in, 1, &b, 1, NULL, 0, &out) == TG_OK, "%s", tg_last_error());
    float o[3];
    CHECK(tg_data(out, o, sizeof o) == TG_OK && o[0] == n && o[2] == n);
  }
  CHECK(tg_jit_export(j, tpath("inner.c"), NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "input 0's dim 1 is symbolic");
  tg_jit_free(j);
  END;
}

/* A variable's name is an argument of the entry point: a macro of the headers the generated C
 * includes (EOF, EINVAL, SIZE_MAX) or of the export itself (MODEL_OK) would not compile there, and
 * is refused; so is a header file name the #include line cannot spell. */
TEST(export_names_the_generated_c_cannot_take) {
  BEGIN;
  tg_tensor x = tg_contiguous(tg_ones(TG_SHAPE(12, 3), NULL));
  CHECK(tg_realize(x) == TG_OK);
  const char *names[] = {"EOF", "EINVAL", "SIZE_MAX", "MODEL_OK", "INT32_MAX", "stdout", "namespace", "typeof", "rows"};
  for (int k = 0; k < 9; k++) {
    tg_symvar v = tg_variable(names[k], 1, 12);
    tg_jit *j = tg_jit_new(rowsum_fn, 1, NULL);
    tg_tensor out;
    for (int n = 4; n < 7; n++) {
      tg_symvar b = tg_var_bind(v, n);
      tg_tensor in = tg_shrink(x, TG_SHAPE(0, tg_sym(b, 0), 0, 3));
      CHECK_MSG(tg_jit_call_vars(j, &in, 1, &b, 1, NULL, 0, &out) == TG_OK, "%s", tg_last_error());
    }
    tg_status st = tg_jit_export(j, tpath("names.c"), NULL);
    if (k < 8) {
      CHECK_MSG(st == TG_ERR_INVALID, "variable %s exported", names[k]);
      CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "cannot name an argument");
    } else {
      CHECK_MSG(st == TG_OK, "%s", tg_last_error());
      CHECK(tg_jit_export(j, tpath("q\"uote.c"), NULL) == TG_ERR_INVALID);
      CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "quote");
    }
    tg_jit_free(j);
  }
  END;
}

/* ---- the beautiful_mnist model (examples/mnist_model.h), random weights, eval mode ---- */

#include "../examples/mnist_model.h"

/* logits and their argmax: two outputs of two dtypes */
static tg_status cnn_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  out[0] = model_forward(u, in[0]);
  out[1] = tg_argmax(out[0], TG_AXES(1), false);
  return TG_OK;
}

static void run_cnn(const char *dir, const char *wpath) {
  BEGIN;
  tg_manual_seed(11);
  Model m;
  CHECK(model_init(&m) == TG_OK);
  tg_jit *j = tg_jit_new(cnn_fn, 2, &m);
  tg_tensor out[2];
  for (int call = 0; call < 3; call++) {
    tg_tensor x = rand_input(TG_SHAPE(4, 1, 28, 28), 200 + (uint64_t)call);
    CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
  }
  tg_tensor x = rand_input(TG_SHAPE(4, 1, 28, 28), 999);
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, out) == TG_OK);
  CHECK(tg_dtype_of(out[1]) == TG_INT32);
  tg_tensor out_clang[2];
  tg_jit *jc = replay_with_cc("clang", cnn_fn, 2, &m, false, x, out_clang);
  static const char *const it[] = {"float"}, *const ot[] = {"float", "int32_t"};
  Case c = {"cnn", it, ot, 1, 2, &x, out, out_clang};
  export_compile_run(j, &c, dir, wpath);
  tg_jit_free(jc);
  tg_jit_free(j);
  model_free(&m);
  END;
}

TEST(export_beautiful_mnist_bit_exact) { run_cnn(tpath("cnn"), NULL); }

/* ---- weights in a safetensors file ---- */

TEST(export_weights_file) {
  char dir[600], mdir[600], w[700], other[700];
  snprintf(dir, sizeof dir, "%s", tpath("cnn-file"));
  snprintf(mdir, sizeof mdir, "%s", tpath("mlp-file"));
  snprintf(w, sizeof w, "%s/cnn.safetensors", dir);
  run_cnn(dir, w);
  /* another export's weights file: the MLP's */
  snprintf(other, sizeof other, "%s/mlp.safetensors", mdir);
  run_mlp(false, mdir, other);
  /* the library reads the file as safetensors */
  tg_scope_begin();
  tg_state_dict *sd = tg_safe_load(w);
  CHECK_MSG(sd && tg_state_dict_len(sd) >= 10, "%s", tg_last_error() ? tg_last_error() : "");
  tg_state_dict_free(sd);
  tg_scope_end();
  tg_clear_error();
  size_t n = 0;
  unsigned char *good = tt_read_file(w, &n);
  CHECK(good && n > 1000);
  if (!good) return;
  struct {
    const char *file;
    size_t len;
    int flip; /* byte to change, or -1 */
    bool extra;
    const char *needle;
  } bad[] = {
      {"trunc-data.safetensors", n - 100, -1, false, "truncated"},
      {"trunc-header.safetensors", 40, -1, false, "header"},
      {"tiny.safetensors", 3, -1, false, "too short"},
      {"empty.safetensors", 0, -1, false, "too short"},
      {"flipped.safetensors", n, (int)(n - 7), false, "checksum"},
      {"header-edit.safetensors", n, 20, false, "header"},
      {"trailing.safetensors", n, -1, true, "after"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, bad[i].file);
    unsigned char *copy = malloc(n + 8);
    memcpy(copy, good, n);
    if (bad[i].flip >= 0) copy[bad[i].flip] ^= 0x5a;
    size_t len = bad[i].len;
    if (bad[i].extra) memcpy(copy + n, "garbage!", 8), len += 8;
    CHECK(write_file(p, copy, len));
    free(copy);
  }
  char log[700];
  snprintf(log, sizeof log, "%s/load.txt", dir);
  for (int b = 0; b < 2; b++) {
    const char *prog = b ? "prog-asan" : "prog-gcc";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      CHECK(sh("cd '%s' && ./%s load %s > load.txt", dir, prog, bad[i].file) == 0);
      char *got = tt_read_file(log, &n);
      CHECK_MSG(got && !strncmp(got, "-3 cnn_load: ", 13) && strstr(got, bad[i].needle), "%s: %s", bad[i].file, got ? got : "(none)");
      free(got);
    }
    /* the MLP's weights, a missing file */
    CHECK(sh("cd '%s' && ./%s load '%s' > load.txt", dir, prog, other) == 0);
    char *got = tt_read_file(log, &n);
    CHECK_MSG(got && !strncmp(got, "-3 ", 3) && strstr(got, "not this model's"), "%s", got ? got : "(none)");
    free(got);
    CHECK(sh("cd '%s' && ./%s load no-such-file > load.txt", dir, prog) == 0);
    got = tt_read_file(log, &n);
    CHECK_MSG(got && !strncmp(got, "-2 ", 3) && strstr(got, "cannot open no-such-file"), "%s", got ? got : "(none)");
    free(got);
    CHECK(sh("cd '%s' && ./%s load cnn.safetensors > load.txt", dir, prog) == 0);
    got = tt_read_file(log, &n);
    CHECK_MSG(got && !strncmp(got, "0 ", 2), "%s", got ? got : "(none)");
    free(got);
  }
  free(good);
}

/* ---- refusals ---- */

static tg_status const_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)in, (void)nin, (void)args, (void)nargs, (void)nout;
  out[0] = tg_mul_s(*(tg_tensor *)u, 2);
  return TG_OK;
}

static tg_status assign_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)u;
  out[0] = tg_assign(in[0], tg_add_s(in[0], 1));
  return TG_OK;
}

TEST(export_errors) {
  BEGIN;
  Mlp m;
  tg_manual_seed(3);
  CHECK(tg_nn_linear_init(&m.l1, 16, 32, true) == TG_OK && tg_nn_linear_init(&m.l2, 32, 10, true) == TG_OK);
  tg_jit *j = tg_jit_new(mlp_fn, 1, &m);
  const char *p = tpath("err.c");
  CHECK(tg_jit_export(NULL, p, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "NULL");
  /* nothing captured yet: not called, then called once */
  CHECK(tg_jit_export(j, p, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "not captured", "call it twice");
  tg_tensor x = rand_input(TG_SHAPE(8, 16), 1), out;
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  CHECK(tg_jit_export(j, p, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "not captured", "1 call");
  x = rand_input(TG_SHAPE(8, 16), 2); /* new data: the same input's result would be realized already */
  CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
  /* unwritable paths; nothing is left behind */
  CHECK(tg_jit_export(j, "/nonexistent-dir/model.c", NULL) == TG_ERR_IO);
  CHECK_ERR(TG_ERR_IO, "tg_jit_export", "/nonexistent-dir/model.c", "cannot create a temporary file");
  CHECK(tg_jit_export(j, tmpdir(), NULL) == TG_ERR_IO);
  CHECK_ERR(TG_ERR_IO, "is not a regular file (a directory)");
  CHECK(tg_jit_export(j, p, TG_JIT_EXPORT_OPTS(.weights_path = "/nonexistent-dir/w.safetensors")) == TG_ERR_IO);
  CHECK_ERR(TG_ERR_IO, "/nonexistent-dir/w.safetensors");
  FILE *f = fopen(p, "r");
  CHECK(f == NULL);
  if (f) fclose(f);
  /* a failed export leaves the files it would replace as they were: the source and header are
   * complete before the weights path turns out to be a directory, and none of them is renamed */
  {
    char oc[4096], oh[4096], wdir[4096];
    snprintf(oc, sizeof oc, "%s", tpath("old.c"));
    snprintf(oh, sizeof oh, "%s", tpath("old.h"));
    snprintf(wdir, sizeof wdir, "%s", tpath("wdir"));
    CHECK(write_text_file(oc, "keep the old source\n") && write_text_file(oh, "keep the old header\n"));
    CHECK(mkdir(wdir, 0755) == 0);
    CHECK(tg_jit_export(j, oc, TG_JIT_EXPORT_OPTS(.weights_path = wdir)) == TG_ERR_IO);
    CHECK_ERR(TG_ERR_IO, "tg_jit_export", "not a regular file (a directory)", "nothing was written");
    CHECK(file_is(oc, "keep the old source\n") && file_is(oh, "keep the old header\n"));
    /* two outputs naming one file: refused before anything is written (it used to report success
     * with the weights written over the source) */
    CHECK(tg_jit_export(j, oc, TG_JIT_EXPORT_OPTS(.weights_path = oh)) == TG_ERR_INVALID);
    CHECK_ERR(TG_ERR_INVALID, "the header", "the weights file", "the same file");
    CHECK(file_is(oc, "keep the old source\n") && file_is(oh, "keep the old header\n"));
    /* a FIFO at the path: refused at once (opening it to write waited for a reader forever) */
    char fifo[4096];
    snprintf(fifo, sizeof fifo, "%s", tpath("fifo.c"));
    CHECK(mkfifo(fifo, 0644) == 0);
    CHECK(tg_jit_export(j, fifo, NULL) == TG_ERR_IO);
    CHECK_ERR(TG_ERR_IO, "not a regular file (a FIFO)");
    struct stat fst;
    CHECK(stat(fifo, &fst) == 0 && S_ISFIFO(fst.st_mode));
    CHECK(count_temp_files(tmpdir()) == 0);
    unlink(fifo), unlink(oc), unlink(oh), rmdir(wdir);
  }
  CHECK(tg_jit_export(j, "", NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "path");
  CHECK(tg_jit_export(j, p, TG_JIT_EXPORT_OPTS(.name = "1net")) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "\"1net\" is not a C identifier");
  CHECK(tg_jit_export(j, p, TG_JIT_EXPORT_OPTS(.name = "my-net")) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "not a C identifier");
  /* names the generated C could not define: a keyword, a C library function it calls, main */
  const char *reserved[] = {"int", "memcpy", "main", "__x", "exp", "puts", "FILE", "uint8_t", "EOF", "stdout", "time",
                            "read", "strange", "expf", "INFINITY", "pthread_run", "TGX_X", "new", "class", "asm", "linux"};
  for (int i = 0; i < 21; i++) {
    CHECK(tg_jit_export(j, p, TG_JIT_EXPORT_OPTS(.name = reserved[i])) == TG_ERR_INVALID);
    CHECK_ERR(TG_ERR_INVALID, "reserved");
  }
  CHECK(tg_jit_export(j, p, NULL) == TG_OK);
  tg_jit_free(j);

  /* a pruned capture with no kernel left: a function of its weights only */
  tg_tensor wt = tg_contiguous(tg_arange(0, 8, 1, NULL));
  CHECK(tg_realize(wt) == TG_OK);
  j = tg_jit_new_opts(const_fn, 1, &wt, TG_JIT_OPTS(.prune = true));
  tg_status st = TG_OK;
  for (int call = 0; call < 3 && st == TG_OK; call++) {
    x = rand_input(TG_SHAPE(8, 16), 10 + (uint64_t)call);
    st = tg_jit_call(j, &x, 1, NULL, 0, &out);
  }
  if (st == TG_OK) {
    CHECK(tg_jit_captured_kernels(j) == 0);
    CHECK(tg_jit_export(j, p, NULL) == TG_ERR_INVALID);
    CHECK_ERR(TG_ERR_INVALID, "captured no kernel", "nothing to export");
  } else {
    CHECK_ERR(TG_ERR_INVALID, "ran no kernel"); /* the jit itself refused the empty capture */
  }
  tg_jit_free(j);

  /* a function that assigns to its input and returns it */
  j = tg_jit_new(assign_fn, 1, NULL);
  tg_tensor a = tg_contiguous(tg_zeros(TG_SHAPE(4), NULL));
  CHECK(tg_realize(a) == TG_OK);
  for (int call = 0; call < 3; call++) CHECK(tg_jit_call(j, &a, 1, NULL, 0, &out) == TG_OK);
  CHECK(tg_jit_export(j, p, NULL) == TG_ERR_INVALID);
  CHECK_ERR(TG_ERR_INVALID, "tg_jit_export", "assigns to its input");
  tg_jit_free(j);
  tg_nn_linear_free(&m.l1), tg_nn_linear_free(&m.l2);
  END;
}

/* in[0] * 2 + a tensor on the same device */
static tg_status mul_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout, void *u) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  out[0] = tg_add(tg_mul_s(tg_sum(in[0], TG_AXES(1), false), 2), *(tg_tensor *)u);
  return TG_OK;
}

/* A jit captured on a device other than CPU is refused: OpenCL (PoCL in make test), or whichever
 * other kind opens here. */
TEST(export_non_cpu_device) {
  BEGIN;
  static const char *const devs[] = {"CL", "CUDA", "NV"};
  int ran = 0;
  for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++) {
    tg_tensor x = tg_contiguous(tg_ones(TG_SHAPE(8, 16), TG_OPTS(.device = devs[d])));
    if (!tg_valid(x) || tg_realize(x) != TG_OK) {
      tg_clear_error();
      continue;
    }
    ran++;
    tg_tensor y = tg_contiguous(tg_ones(TG_SHAPE(8), TG_OPTS(.device = devs[d])));
    tg_tensor out;
    CHECK(tg_realize(y) == TG_OK);
    tg_jit *j = tg_jit_new(mul_fn, 1, &y);
    for (int call = 0; call < 3; call++) CHECK(tg_jit_call(j, &x, 1, NULL, 0, &out) == TG_OK);
    CHECK(tg_jit_export(j, tpath("dev.c"), NULL) == TG_ERR_INVALID);
    CHECK_ERR(TG_ERR_INVALID, "only jits captured on the CPU device");
    tg_jit_free(j);
  }
  CHECK_MSG(ran > 0, "no device other than CPU could be opened (OpenCL needs an ICD such as PoCL)");
  END;
}

int main(void) {
  /* the library's own kernels come from gcc here, as the gcc builds of the exported files do (the
   * clang builds are compared with a replay whose kernels clang built: replay_with_cc) */
  tg_context_begin();
  tg_context_set("CC", "gcc");
  int rc = RUN_TESTS();
  tg_context_end();
  if (!rc) tmpdir_remove();
  return rc;
}
