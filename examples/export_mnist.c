/*
 * export_mnist.c -- the beautiful_mnist CNN as a standalone C program with no tinygrad in it.
 *
 * Loads the weights `make mnist` saved (MNIST_LOAD, default mnist.safetensors) or, without them,
 * trains briefly (STEPS, BS); TinyJits the classifier `argmax(model(x))` on EXPORT_BS images (uint8,
 * as the IDX files hold them); exports it with tg_jit_export to EXPORT_DIR (default mnist_export:
 * mnist_net.c, mnist_net.h and, with EXPORT_WEIGHTS_FILE=1, mnist_net.safetensors); writes the
 * Fashion-MNIST test set there as plain IDX files and a small main (classify.c); compiles it with
 * the system compiler (CC, default cc; EXPORT_THREADS=1 adds -DTG_EXPORT_THREADS -pthread) into
 * EXPORT_DIR/classify; runs it and checks that its predictions are the library's, image for image.
 *
 *   ./build/examples/export_mnist && ./mnist_export/classify mnist_export/t10k-images-idx3-ubyte \
 *       mnist_export/t10k-labels-idx1-ubyte
 *
 * BENCH=1 also times both on the whole test set (bench/export_mnist.sh reports the ratio): the
 * library's replays in this process, and the standalone program's faster of two passes
 * (CLASSIFY_PASSES=2), so both are timed warm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <tinygrad.h>

#include "mnist_model.h"

/* @TinyJit def classify(x): return model(x).argmax(axis=1) */
static tg_status classify(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                          void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  out[0] = tg_argmax(model_forward(((Ctx *)user)->model, in[0]), TG_AXES(1), false);
  return TG_OK;
}

static double clock_s(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }

static int fail(const char *what) {
  fprintf(stderr, "export_mnist: %s: %s\n", what, tg_last_error() ? tg_last_error() : "unknown error");
  return 1;
}

/* The standalone program: reads IDX images (and labels), classifies them in batches of the
 * exported size, prints the accuracy; argv[3] (optional) receives the predictions as int32. */
static const char CLASSIFY_C[] =
    "/* classify.c -- Fashion-MNIST classifier on the exported mnist_net (no tinygrad needed). */\n"
    "#define _POSIX_C_SOURCE 200809L /* clock_gettime */\n"
    "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n#include \"mnist_net.h\"\n\n"
    "static unsigned char *read_idx(const char *path, unsigned magic, long *n) {\n"
    "  FILE *f = fopen(path, \"rb\");\n"
    "  if (!f) { fprintf(stderr, \"classify: cannot open %s\\n\", path); return NULL; }\n"
    "  unsigned char h[16];\n"
    "  size_t hl = magic == 0x803 ? 16 : 8;\n"
    "  unsigned char *d = NULL;\n"
    "  if (fread(h, 1, hl, f) == hl && (unsigned)(h[0] << 24 | h[1] << 16 | h[2] << 8 | h[3]) == magic) {\n"
    "    *n = (long)h[4] << 24 | h[5] << 16 | h[6] << 8 | h[7];\n"
    "    long per = magic == 0x803 ? 28 * 28 : 1;\n"
    "    if (magic == 0x803 && (h[11] != 28 || h[15] != 28 || h[8] | h[9] | h[10] | h[12] | h[13] | h[14])) per = 0;\n"
    "    d = per && *n > 0 ? (unsigned char *)malloc((size_t)(*n * per)) : NULL;\n"
    "    if (d && fread(d, 1, (size_t)(*n * per), f) != (size_t)(*n * per)) free(d), d = NULL;\n"
    "  }\n"
    "  if (!d) fprintf(stderr, \"classify: %s is not an IDX file of %s\\n\", path, magic == 0x803 ? \"28x28 images\" : \"labels\");\n"
    "  fclose(f);\n"
    "  return d;\n"
    "}\n\n"
    "int main(int argc, char **argv) {\n"
    "  if (argc < 2) { fprintf(stderr, \"usage: %s images-idx3-ubyte [labels-idx1-ubyte [predictions.bin]]\\n\", argv[0]); return 2; }\n"
    "#ifdef MNIST_NET_WEIGHTS\n"
    "  if (mnist_net_load(MNIST_NET_WEIGHTS) != MNIST_NET_OK) { fprintf(stderr, \"%s\\n\", mnist_net_last_error()); return 1; }\n"
    "#endif\n"
    "  long n = 0, nl = 0, bs = MNIST_NET_IN0_DIM0, right = 0;\n"
    "  unsigned char *img = read_idx(argv[1], 0x803, &n), *lab = argc > 2 ? read_idx(argv[2], 0x801, &nl) : NULL;\n"
    "  if (!img || (argc > 2 && (!lab || nl != n))) return 1;\n"
    "  int32_t *pred = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n + bs));\n"
    "  uint8_t *batch = (uint8_t *)calloc(MNIST_NET_IN0_BYTES, 1);\n"
    "  struct timespec t0, t1, c0, c1;\n"
    "  /* CLASSIFY_PASSES=n: classify the set n times and report the fastest pass (a warm process) */\n"
    "  const char *pe = getenv(\"CLASSIFY_PASSES\");\n"
    "  int passes = pe && atoi(pe) > 1 ? atoi(pe) : 1;\n"
    "  double s = 1e30, cs = 0;\n"
    "  for (int pass = 0; pass < passes; pass++) {\n"
    "    clock_gettime(CLOCK_MONOTONIC, &t0);\n"
    "    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);\n"
    "    for (long i = 0; i < n; i += bs) {\n"
    "      long k = n - i < bs ? n - i : bs; /* the last batch is padded with blank images */\n"
    "      memset(batch, 0, MNIST_NET_IN0_BYTES);\n"
    "      memcpy(batch, img + i * 784, (size_t)(k * 784));\n"
    "      if (mnist_net(batch, pred + i) != MNIST_NET_OK) { fprintf(stderr, \"%s\\n\", mnist_net_last_error()); return 1; }\n"
    "    }\n"
    "    clock_gettime(CLOCK_MONOTONIC, &t1);\n"
    "    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);\n"
    "    double ps = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;\n"
    "    if (ps < s) s = ps, cs = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;\n"
    "  }\n"
    "  for (long i = 0; lab && i < n; i++) right += pred[i] == lab[i];\n"
    "  printf(\"classify: %ld images in %.3f s (%.0f images/s, batch %ld; %.3f s of CPU time)\", n, s, (double)n / s, bs, cs);\n"
    "  if (lab) printf(\", accuracy %.2f%%\", 100.0 * (double)right / (double)n);\n"
    "  printf(\"\\n\");\n"
    "  if (argc > 3) {\n"
    "    FILE *f = fopen(argv[3], \"wb\");\n"
    "    if (!f || fwrite(pred, sizeof(int32_t), (size_t)n, f) != (size_t)n) return 1;\n"
    "    fclose(f);\n"
    "  }\n"
    "  free(img), free(lab), free(pred), free(batch);\n"
    "#ifdef MNIST_NET_WEIGHTS\n"
    "  mnist_net_free();\n"
    "#endif\n"
    "  return 0;\n"
    "}\n";

static bool write_idx(const char *path, const uint8_t *data, long n, bool images) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  uint8_t h[16] = {0, 0, 8, images ? 3 : 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n,
                   0, 0, 0, 28, 0, 0, 0, 28};
  size_t hl = images ? 16 : 8, nb = (size_t)n * (images ? 784 : 1);
  bool ok = fwrite(h, 1, hl, f) == hl && fwrite(data, 1, nb, f) == nb;
  return fclose(f) == 0 && ok;
}

/* s as one single-quoted shell word ('\'' for each quote): paths go into the commands system() runs */
static const char *shq(const char *s, char *out, size_t cap) {
  size_t o = 0;
  if (cap < 3) return "''";
  out[o++] = '\'';
  for (; *s && o + 5 < cap; s++) {
    if (*s == '\'') memcpy(out + o, "'\\''", 4), o += 4;
    else out[o++] = *s;
  }
  out[o++] = '\'';
  out[o] = '\0';
  return out;
}

int main(void) {
  int64_t bs = tg_getenv_int("BS", 128), steps = tg_getenv_int("STEPS", 40), ebs = tg_getenv_int("EXPORT_BS", 100);
  const char *load = getenv("MNIST_LOAD") ? getenv("MNIST_LOAD") : "mnist.safetensors";
  const char *dir = getenv("EXPORT_DIR") && *getenv("EXPORT_DIR") ? getenv("EXPORT_DIR") : "mnist_export";
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  bool threads = tg_getenv_int("EXPORT_THREADS", 0) != 0, wfile = tg_getenv_int("EXPORT_WEIGHTS_FILE", 0) != 0;
  bool bench = tg_getenv_int("BENCH", 0) != 0;
  if (bs <= 0 || steps < 0 || ebs <= 0) {
    fprintf(stderr, "export_mnist: BS, STEPS and EXPORT_BS must be positive\n");
    return 1;
  }
  tg_manual_seed((uint64_t)tg_getenv_int("SEED", 42));
  tg_scope_begin();
  Ctx c = {0};
  c.bs = bs;
  if (tg_mnist_load(NULL, true, &c.X_train, &c.Y_train, &c.X_test, &c.Y_test) != TG_OK) return fail("loading Fashion-MNIST");
  Model model;
  memset(&model, 0, sizeof model);
  c.model = &model;
  if (model_init(&model) != TG_OK) return fail("creating the model");
  tg_state_dict *sd = tg_state_dict_new();
  if (model_state(&model, sd) != TG_OK) return fail("collecting parameters");
  struct stat sst;
  if (load && *load && stat(load, &sst) == 0) {
    tg_state_dict *w = tg_safe_load(load);
    if (!w || tg_load_state_dict(sd, w, true) != TG_OK) return fail("loading the weights");
    tg_state_dict_free(w);
    printf("loaded weights from %s\n", load);
  } else {
    int np = tg_state_dict_parameters(sd, false, NULL, 0);
    tg_tensor *params = malloc(sizeof(tg_tensor) * (size_t)(np + 1));
    tg_state_dict_parameters(sd, false, params, np);
    c.opt = tg_optim_adam(params, np, NULL);
    free(params);
    if (!c.opt) return fail("creating the optimizer");
    tg_jit *jtrain = tg_jit_new(train_step, 1, &c);
    double loss = 0;
    for (int64_t i = 0; i < steps; i++) {
      tg_scope_begin();
      tg_tensor lo;
      if (tg_jit_call(jtrain, NULL, 0, NULL, 0, &lo) != TG_OK || tg_item(lo, &loss) != TG_OK) return fail("train step");
      tg_scope_end();
      fprintf(stderr, "\rtraining (no %s): step %lld/%lld, loss %.3f", *load ? load : "weights file (MNIST_LOAD is empty)", (long long)i + 1, (long long)steps, loss);
    }
    fprintf(stderr, "\n");
    tg_jit_free(jtrain);
  }

  /* the library's predictions for every test image, EXPORT_BS at a time (the last batch padded) */
  long n = (long)tg_dim(c.X_test, 0);
  if (ebs >= n) /* (a jit captures on its second call) */
    return fprintf(stderr, "export_mnist: EXPORT_BS %lld must be below the test set's %ld images: the export needs two batches\n",
                   (long long)ebs, n), 1;
  uint8_t *img = calloc((size_t)(n + ebs) * 784, 1), *lab = malloc((size_t)n);
  int32_t *want = malloc(sizeof(int32_t) * (size_t)(n + ebs)), *got = malloc(sizeof(int32_t) * (size_t)(n + ebs));
  if (!img || !lab || !want || !got) return fprintf(stderr, "export_mnist: out of memory\n"), 1;
  if (tg_data(c.X_test, img, (size_t)n * 784) != TG_OK || tg_data(c.Y_test, lab, (size_t)n) != TG_OK) return fail("reading the test set");
  tg_jit *jc = tg_jit_new(classify, 1, &c);
  double t_lib = 0;
  for (int pass = 0; pass < (bench ? 2 : 1); pass++) { /* BENCH: the second pass is all replays */
    double t0 = now();
    for (long i = 0; i < n; i += ebs) {
      tg_scope_begin();
      tg_tensor x = tg_from_data(img + i * 784, TG_SHAPE(ebs, 1, 28, 28), TG_OPTS(.dtype = TG_UINT8)), p;
      if (tg_jit_call(jc, &x, 1, NULL, 0, &p) != TG_OK || tg_data(p, want + i, sizeof(int32_t) * (size_t)ebs) != TG_OK)
        return fail("classifying with the library");
      tg_scope_end();
    }
    t_lib = now() - t0;
  }
  long right = 0;
  for (long i = 0; i < n; i++) right += want[i] == lab[i];
  printf("library: %ld test images, accuracy %.2f%%\n", n, 100.0 * (double)right / (double)n);

  /* export, then build and run the standalone program */
  char path[4096], wpath[4096], cmd[16384];
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/mnist_net.c", dir);
  snprintf(wpath, sizeof wpath, "%s/mnist_net.safetensors", dir);
  if (tg_jit_export(jc, path, TG_JIT_EXPORT_OPTS(.name = "mnist_net", .weights_path = wfile ? wpath : NULL)) != TG_OK)
    return fail("exporting");
  printf("exported %d kernel launches to %s (and mnist_net.h)\n", tg_jit_captured_kernels(jc), path);
  snprintf(path, sizeof path, "%s/classify.c", dir);
  FILE *f = fopen(path, "w");
  if (!f || fputs(CLASSIFY_C, f) < 0 || fclose(f) != 0) return fprintf(stderr, "export_mnist: cannot write %s\n", path), 1;
  char ipath[4096], lpath[4096], ppath[4096];
  snprintf(ipath, sizeof ipath, "%s/t10k-images-idx3-ubyte", dir);
  snprintf(lpath, sizeof lpath, "%s/t10k-labels-idx1-ubyte", dir);
  snprintf(ppath, sizeof ppath, "%s/predictions.bin", dir);
  if (!write_idx(ipath, img, n, true) || !write_idx(lpath, lab, n, false))
    return fprintf(stderr, "export_mnist: cannot write the IDX files in %s\n", dir), 1;
  char wdef[4200] = "", q[4][8300], def[4200];
  if (wfile) {
    /* (a C string literal inside one shell word) */
    if (strpbrk(wpath, "\"\\")) return fprintf(stderr, "export_mnist: EXPORT_DIR may not hold a quote or a backslash with EXPORT_WEIGHTS_FILE\n"), 1;
    snprintf(def, sizeof def, "-DMNIST_NET_WEIGHTS=\"%s\"", wpath);
    shq(def, wdef, sizeof wdef);
  }
  /* the library's kernel flags: the same bits as the library (CC is a command, as make's) */
  snprintf(cmd, sizeof cmd,
           "cd %s && %s -std=c11 -O2 -march=native -ffp-contract=fast -fno-math-errno -fwrapv -fno-stack-protector -Wall -Wextra %s %s -o classify "
           "classify.c mnist_net.c -lm",
           shq(dir, q[0], sizeof q[0]), cc, threads ? "-DTG_EXPORT_THREADS -pthread" : "", wdef);
  printf("%s\n", cmd);
  if (system(cmd) != 0) return fprintf(stderr, "export_mnist: compiling the exported classifier failed\n"), 1;
  char exe[4200];
  snprintf(exe, sizeof exe, "%s/classify", dir);
  snprintf(cmd, sizeof cmd, "%s %s %s %s", shq(exe, q[0], sizeof q[0]), shq(ipath, q[1], sizeof q[1]), shq(lpath, q[2], sizeof q[2]),
           shq(ppath, q[3], sizeof q[3]));
  double t0 = now();
  if (system(cmd) != 0) return fprintf(stderr, "export_mnist: the exported classifier failed\n"), 1;
  double t_run = now() - t0;
  /* BENCH: library replays and the standalone program, alternately (this machine's load varies),
   * best of three each */
  double best_lib = (double)n / t_lib, best_exp = 0, cpu_lib = 1e30, cpu_exp = 1e30; /* CPU s per image */
  for (int r = 0; bench && r < 3; r++) {
    double t1 = now(), c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < n; i += ebs) {
      tg_scope_begin();
      tg_tensor x = tg_from_data(img + i * 784, TG_SHAPE(ebs, 1, 28, 28), TG_OPTS(.dtype = TG_UINT8)), p;
      if (tg_jit_call(jc, &x, 1, NULL, 0, &p) != TG_OK || tg_data(p, want + i, sizeof(int32_t) * (size_t)ebs) != TG_OK)
        return fail("classifying with the library");
      tg_scope_end();
    }
    double r_lib = (double)n / (now() - t1), r_exp = 0, c_lib = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c1) / (double)n;
    if (c_lib < cpu_lib) cpu_lib = c_lib;
    if (r_lib > best_lib) best_lib = r_lib;
    /* its fastest of two passes: a warm process, as the library's replays run in one */
    snprintf(cmd, sizeof cmd, "CLASSIFY_PASSES=2 %s %s", shq(exe, q[0], sizeof q[0]), shq(ipath, q[1], sizeof q[1]));
    FILE *pp = popen(cmd, "r");
    char line[512];
    while (pp && fgets(line, sizeof line, pp)) {
      const char *q = strstr(line, " s (");
      if (q) r_exp = atof(q + 4);
      const char *cq = strstr(line, "; ");
      if (cq && atof(cq + 2) > 0 && atof(cq + 2) / (double)n < cpu_exp) cpu_exp = atof(cq + 2) / (double)n;
    }
    if (pp) pclose(pp);
    if (r_exp > best_exp) best_exp = r_exp;
  }
  if (bench)
    printf("bench library_replay images_per_s=%.1f exported images_per_s=%.1f ratio=%.2f (best of 3, %s)\n", best_lib,
           best_exp, best_exp / best_lib, threads ? "threads" : "one thread");
  /* one thread: CPU time per image, which another process's load on the machine moves much less
   * than the wall clock (with threads the workers' polling counts as CPU time, so it is not shown) */
  if (bench && !threads)
    printf("bench library_replay cpu_us_per_image=%.1f exported cpu_us_per_image=%.1f ratio=%.2f (best of 3, one thread)\n",
           cpu_lib * 1e6, cpu_exp * 1e6, cpu_lib / cpu_exp);
  f = fopen(ppath, "rb");
  size_t m = f ? fread(got, sizeof(int32_t), (size_t)n, f) : 0;
  if (f) fclose(f);
  long same = 0;
  for (long i = 0; i < (long)m; i++) same += got[i] == want[i];
  printf("standalone and library agree on %ld of %ld test images\n", same, n);
  snprintf(path, sizeof path, "%s/classify", dir);
  if (bench && stat(path, &sst) == 0)
    printf("bench classify_binary_bytes=%lld process_s=%.3f\n", (long long)sst.st_size, t_run);
  int rc = same == n ? 0 : 1;
  tg_jit_free(jc);
  free(img), free(lab), free(want), free(got);
  tg_optim_free(c.opt);
  tg_state_dict_free(sd);
  model_free(&model);
  tg_scope_end();
  return rc;
}
