/*
 * test_viz.c -- VIZ=1 / VIZ=-1 / PROFILE=1. The settings are read when the library loads, so each
 * case runs this binary again as a child (`test_viz --child`: a softmax, a small matmul + relu and a
 * TinyJit called four times, results printed) with the environment it needs, and checks what the
 * child printed and wrote: the page's files, the trace, the server's answers, the error messages.
 * tests/test_viz.py loads the page in headless Chromium.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tinygrad.h"
#include "test.h"

/* ---- the child: the program whose run is recorded ---- */
static tg_status jit_fn(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out, int nout,
                        void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout, (void)user;
  out[0] = tg_relu(tg_sub_s(tg_mul_s(in[0], 2), 1));
  return tg_last_status();
}

static int child_main(void) {
  tg_scope_begin();
  float x[4 * 100], a[16 * 32], w[32 * 8];
  for (int i = 0; i < 400; i++) x[i] = (float)((i * 37) % 101) / 17.0f - 3.0f;
  for (int i = 0; i < 16 * 32; i++) a[i] = (float)((i * 13) % 29) / 7.0f - 2.0f;
  for (int i = 0; i < 32 * 8; i++) w[i] = (float)((i * 7) % 31) / 11.0f - 1.4f;
  tg_tensor tx = tg_from_data(x, TG_SHAPE(4, 100), NULL);
  tg_tensor sm = tg_softmax(tx, 1);
  tg_tensor y =
      tg_relu(tg_matmul(tg_from_data(a, TG_SHAPE(16, 32), NULL), tg_from_data(w, TG_SHAPE(32, 8), NULL)));
  float out1[400], out2[128];
  if (tg_data(sm, out1, sizeof out1) != TG_OK || tg_data(y, out2, sizeof out2) != TG_OK) {
    fprintf(stderr, "child: %s\n", tg_last_error());
    return 1;
  }
  for (int i = 0; i < 400; i++) printf("%a\n", out1[i]);
  for (int i = 0; i < 128; i++) printf("%a\n", out2[i]);
  /* a TinyJit: two runs, then two replays (runs outside any schedule) */
  tg_jit *j = tg_jit_new(jit_fn, 1, NULL);
  for (int call = 0; call < 4; call++) {
    float v[64], o[64];
    for (int i = 0; i < 64; i++) v[i] = (float)(i * (call + 1) % 13) / 5.0f - 1.0f;
    tg_tensor in = tg_from_data(v, TG_SHAPE(64), NULL), res;
    if (tg_jit_call(j, &in, 1, NULL, 0, &res) != TG_OK || tg_data(res, o, sizeof o) != TG_OK) {
      fprintf(stderr, "child: %s\n", tg_last_error());
      return 1;
    }
    for (int i = 0; i < 64; i++) printf("%a\n", o[i]);
  }
  tg_jit_free(j);
  printf("kernels %llu\n", (unsigned long long)tg_global_counters().kernel_count);
  tg_scope_end();
  printf("live %zu\n", tg_live_count());
  fflush(stdout);
  return 0;
}

/* ---- running it ---- */
static char self_path[4096];

typedef struct {
  pid_t pid;
  char out[300], err[300];
} Child;

/* Starts the child with env entries "NAME=value" set ("NAME=" removes NAME); stdout and stderr go
 * to files named after tag. */
static Child child_start(const char *tag, const char *const *env) {
  Child c;
  snprintf(c.out, sizeof c.out, "%s/%s.out", tmpdir(), tag);
  snprintf(c.err, sizeof c.err, "%s/%s.err", tmpdir(), tag);
  fflush(NULL);
  c.pid = fork();
  if (c.pid == 0) {
    unsetenv("VIZ"), unsetenv("PROFILE"), unsetenv("VIZ_DIR"), unsetenv("PROFILE_PATH"), unsetenv("PORT");
    for (int i = 0; env && env[i]; i++) {
      char name[64];
      const char *eq = strchr(env[i], '=');
      snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
      if (eq[1])
        setenv(name, eq + 1, 1);
      else
        unsetenv(name);
    }
    int o = open(c.out, O_WRONLY | O_CREAT | O_TRUNC, 0644),
        e = open(c.err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1), dup2(e, 2);
    execl(self_path, self_path, "--child", (char *)NULL);
    _exit(127);
  }
  return c;
}

/* Waits up to secs for the child; its exit status, or -1 (killed after the time, or by a signal). */
static int child_wait(Child *c, double secs) {
  for (int i = 0; i < (int)(secs * 100); i++) {
    int st;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(c->pid, SIGKILL);
  waitpid(c->pid, NULL, 0);
  return -1;
}

/* The whole file (also /proc files, whose size reads as 0), "" if it cannot be read. */
static char *slurp(const char *path) {
  size_t n = 0, cap = 1 << 16;
  char *s = malloc(cap);
  FILE *f = fopen(path, "rb");
  if (f) {
    size_t r;
    while ((r = fread(s + n, 1, cap - n - 1, f)) > 0)
      if ((n += r) + 1 == cap) s = realloc(s, cap *= 2);
    fclose(f);
  }
  s[n] = 0;
  return s;
}

/* hay contains needle (on failure, the start of hay is shown, not all of it) */
#define CHECK_HAS(hay, needle)                                                                               \
  CHECK_MSG(strstr((hay), (needle)) != NULL, "no \"%s\" in \"%.300s\"...", (needle), (hay))

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static char *plain_output; /* the child's stdout without VIZ or PROFILE */

static const char *plain(void) {
  if (!plain_output) {
    Child c = child_start("plain", NULL);
    int rc = child_wait(&c, 60);
    CHECK_MSG(rc == 0, "plain child exited with %d", rc);
    plain_output = slurp(c.out);
    char *err = slurp(c.err);
    CHECK_MSG(!strstr(err, "VIZ") && !strstr(err, "PROFILE"), "stderr without VIZ: %s", err);
    free(err);
  }
  return plain_output;
}

/* ---- tests ---- */

TEST(write_page_and_trace_results_unchanged) {
  char dir[400], trace[400], env1[420], env2[420];
  snprintf(dir, sizeof dir, "%s/page", tmpdir());
  snprintf(trace, sizeof trace, "%s/trace.json", tmpdir());
  snprintf(env1, sizeof env1, "VIZ_DIR=%s", dir);
  snprintf(env2, sizeof env2, "PROFILE_PATH=%s", trace);
  const char *env[] = {"VIZ=-1", "PROFILE=1", env1, env2, "DEBUG=2", NULL};
  Child c = child_start("write", env);
  int rc = child_wait(&c, 60);
  CHECK_MSG(rc == 0, "child exited with %d", rc);
  char *out = slurp(c.out), *err = slurp(c.err);
  /* VIZ and PROFILE change no result */
  CHECK_MSG(strcmp(out, plain()) == 0, "results with VIZ differ:\n%.200s\nwithout:\n%.200s", out, plain());
  CHECK_HAS(out, "live 0");
  CHECK_HAS(err, "VIZ: wrote the page to");
  CHECK_HAS(err, "/page/index.html");
  CHECK_HAS(err, "PROFILE: wrote");
  CHECK_HAS(err, trace);
  const char *files[] = {"index.html", "viz.js", "viz.css", "data.js"};
  for (int i = 0; i < 4; i++) {
    char p[500];
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    struct stat st;
    CHECK_MSG(stat(p, &st) == 0 && st.st_size > 100, "%s missing or empty", p);
  }
  char p[500];
  snprintf(p, sizeof p, "%s/data.js", dir);
  char *data = slurp(p);
  /* every kernel DEBUG=2 reported running ("*** CPU  1 r_1_25 ..."), with its source and AST, and
   * the graphs laid out */
  CHECK_HAS(data, "window.TG_VIZ = {");
  char names[32][64];
  int nk = 0;
  for (const char *l = err; (l = strstr(l, "*** CPU")); l++)
    if (nk < 32 && sscanf(l, "*** CPU %*d %63s", names[nk]) == 1) nk++;
  CHECK_MSG(nk == 8, "%d kernel runs in DEBUG=2's output (softmax 3, matmul + relu 1, the jit's 4)", nk);
  const char *k = strstr(out, "kernels ");
  unsigned long long counted = 0;
  CHECK(k && sscanf(k, "kernels %llu", &counted) == 1 && counted == (unsigned long long)nk);
  char *tr = slurp(trace);
  for (int i = 0; i < nk; i++) {
    char want[1200];
    snprintf(want, sizeof want, "{\"name\": \"%.63s\", \"device\": \"CPU\"", names[i]);
    CHECK_HAS(data, want);
    snprintf(want, sizeof want,
             "{\"name\": \"%.63s\", \"cat\": \"kernel\", \"ph\": \"X\", \"pid\": 0, \"tid\": 0", names[i]);
    CHECK_HAS(tr, want);
  }
  CHECK_HAS(data, "REDUCE_AXIS MAX axes=(1,)");
  CHECK_HAS(data, "REDUCE_AXIS ADD axes=(2,)");
  CHECK_HAS(data, "\"svgs\": [\"\\u003csvg");
  CHECK_HAS(data, "\"svg\": 0,");
  /* the jit's two recorded calls realize one graph: one layout, stored once, for both (each realize's
   * edges used to come out in a different order, and each got a layout of its own) */
  CHECK(count(data, "\"svg\": 2,") == 2 && count(data, "\"svgs\": [") == 1 && count(data, "\\u003csvg ") == 3);
  CHECK_HAS(data, " STORE float \\u003c- ");
  CHECK_HAS(data, "\"dot_error\": null");
  /* kernels are recorded once (the softmax's two reductions are different kernels of one name; the
   * jit's kernel runs 4 times): 5 */
  int nsrc = count(data, "\"src\": \"");
  CHECK_MSG(nsrc == 5, "%d kernels with source", nsrc);
  CHECK_MSG(count(data, ",-1,-1,0,0,") == 2, "%d runs outside a schedule (jit replays)",
            count(data, ",-1,-1,0,0,"));
  /* objdump of the CPU kernels: each one's own function */
  CHECK_MSG(count(data, "\"asm\": \"\\u003c") == nsrc, "%d kernels with assembly",
            count(data, "\"asm\": \"\\u003c"));
  for (int i = 0; i < nk; i++) {
    char want[200];
    snprintf(want, sizeof want, "\"asm\": \"\\u003c%.60s\\u003e:\\n\\t", names[i]);
    CHECK_HAS(data, want);
  }
  /* the trace: one complete event per kernel run, on the CPU, named after the kernel */
  CHECK_HAS(tr, "\"traceEvents\"");
  CHECK_MSG(count(tr, "\"cat\": \"kernel\", \"ph\": \"X\"") == nk, "%d kernel events, %d kernels run",
            count(tr, "\"cat\": \"kernel\", \"ph\": \"X\""), nk);
  CHECK_HAS(
      tr,
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"CPU\"}}");
  CHECK_HAS(tr, "\"GFLOPS\": ");
  CHECK_HAS(tr, "{\"name\": \"memory\", \"ph\": \"C\"");
  free(tr), free(data), free(out), free(err);
}

static bool put_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs(text, f) >= 0;
  return fclose(f) == 0 && ok;
}

TEST(missing_dot_is_said_on_the_page) {
  char dir[400], env1[420];
  snprintf(dir, sizeof dir, "%s/nodot", tmpdir());
  snprintf(env1, sizeof env1, "VIZ_DIR=%s", dir);
  const char *env[] = {"VIZ=-1", env1, "VIZ_DOT=/nonexistent/dot", NULL};
  Child c = child_start("nodot", env);
  CHECK(child_wait(&c, 60) == 0);
  char p[500];
  snprintf(p, sizeof p, "%s/data.js", dir);
  char *data = slurp(p);
  CHECK_HAS(data, "'/nonexistent/dot' program was not found");
  CHECK_HAS(data, "install the graphviz package");
  CHECK_HAS(data, "\"dot\": \"digraph schedule");
  CHECK(!strstr(data, "\\u003csvg"));
  free(data);
}

/* a program whose file name is not UTF-8: data.js names it with U+FFFD for the bad bytes (raw bytes
 * made the page's script invalid, and the page blank) */
TEST(non_utf8_program_name) {
  char copy[400], dir[400], env1[420], saved[sizeof self_path];
  snprintf(copy, sizeof copy, "%s/prog\xff\xfe-\xe2\x80\xa8-\xc3\xa9", tmpdir());
  snprintf(dir, sizeof dir, "%s/badname", tmpdir());
  snprintf(env1, sizeof env1, "VIZ_DIR=%s", dir);
  FILE *in = fopen(self_path, "rb"), *out = fopen(copy, "wb");
  CHECK(in && out);
  char buf[65536];
  size_t n;
  while (in && out && (n = fread(buf, 1, sizeof buf, in)) > 0) CHECK(fwrite(buf, 1, n, out) == n);
  if (in) fclose(in);
  CHECK(out && fclose(out) == 0 && chmod(copy, 0755) == 0);
  memcpy(saved, self_path, sizeof saved);
  snprintf(self_path, sizeof self_path, "%s", copy);
  const char *env[] = {"VIZ=-1", env1, NULL};
  Child c = child_start("badname", env);
  memcpy(self_path, saved, sizeof saved);
  CHECK(child_wait(&c, 60) == 0);
  char p[500];
  snprintf(p, sizeof p, "%s/data.js", dir);
  char *data = slurp(p);
  CHECK_HAS(data, "/prog\\ufffd\\ufffd-\\u2028-\xc3\xa9\"");
  free(data);
  unlink(copy);
}


/* a dot that never finishes: the program still exits, within VIZ_DOT_TIMEOUT, and the page says why
 * the graphs are text */
TEST(slow_dot_is_cut_off) {
  char dir[400], env1[420], script[400], env2[420];
  snprintf(dir, sizeof dir, "%s/slowdot", tmpdir());
  snprintf(script, sizeof script, "%s/slowdot.sh", tmpdir());
  CHECK(put_text(script, "#!/bin/sh\nexec sleep 60\n") && chmod(script, 0755) == 0);
  snprintf(env1, sizeof env1, "VIZ_DIR=%s", dir);
  snprintf(env2, sizeof env2, "VIZ_DOT=%s", script);
  const char *env[] = {"VIZ=-1", env1, env2, "VIZ_DOT_TIMEOUT=0.5", NULL};
  double t0 = tt_now_s();
  Child c = child_start("slowdot", env);
  CHECK(child_wait(&c, 30) == 0);
  CHECK_MSG(tt_now_s() - t0 < 20, "the child took %.1f s", tt_now_s() - t0);
  char p[500];
  snprintf(p, sizeof p, "%s/data.js", dir);
  char *data = slurp(p), *err = slurp(c.err);
  CHECK_HAS(data, "did not finish in VIZ_DOT_TIMEOUT=0.5 s");
  CHECK_HAS(data, "\"dot\": \"digraph schedule");
  CHECK_HAS(err, "VIZ: Graphviz's dot did not finish laying out");
  free(data), free(err);
}


/* Runs the child with VIZ=-1 VIZ_DIR=dir (it must exit 0); what it printed on stderr (malloc'd). */
static char *page_to_dir(const char *tag, const char *dir) {
  char env[420];
  snprintf(env, sizeof env, "VIZ_DIR=%s", dir);
  const char *envs[] = {"VIZ=-1", env, NULL};
  Child c = child_start(tag, envs);
  CHECK(child_wait(&c, 60) == 0);
  return slurp(c.err);
}

TEST(unwritable_dirs_are_clear_errors) {
  const char *env[] = {"VIZ=-1", "VIZ_DIR=/proc/no/such/dir", "PROFILE=1",
                       "PROFILE_PATH=/proc/no/such/trace.json", NULL};
  Child c = child_start("unwritable", env);
  CHECK(child_wait(&c, 60) == 0);
  char *err = slurp(c.err), *out = slurp(c.out);
  CHECK_HAS(err, "VIZ: cannot write the page to VIZ_DIR=/proc/no/such/dir: cannot create the directory");
  CHECK_HAS(err, "(set VIZ_DIR to a writable directory)");
  CHECK_HAS(err, "PROFILE: cannot write the trace to PROFILE_PATH=/proc/no/such/trace.json");
  CHECK(strcmp(out, plain()) == 0);
  free(err), free(out);
  /* a file where the directory should be */
  char file[400];
  snprintf(file, sizeof file, "%s/plainfile", tmpdir());
  CHECK(put_text(file, "x"));
  err = page_to_dir("notdir", file);
  CHECK_HAS(err, "it exists and is not a directory");
  free(err);
  /* a symbolic link planted where a page file goes (VIZ_DIR in a shared /tmp) is not written through */
  char dir[400], victim[420], link[440];
  snprintf(dir, sizeof dir, "%s/planted", tmpdir());
  snprintf(victim, sizeof victim, "%s/victim.txt", tmpdir());
  snprintf(link, sizeof link, "%s/index.html", dir);
  CHECK(mkdir(dir, 0755) == 0);
  CHECK(put_text(victim, "keep me"));
  CHECK(symlink(victim, link) == 0);
  err = page_to_dir("planted", dir);
  CHECK_HAS(err, "cannot write");
  free(err);
  char *v = slurp(victim);
  CHECK(strcmp(v, "keep me") == 0);
  free(v);
}

/* An HTTP request to 127.0.0.1:port; the whole answer (malloc'd), "" if none. */
static char *http(int port, const char *request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  buf[0] = 0;
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0) close(fd);
    return buf;
  }
  if (write(fd, request, strlen(request)) < 0) {
    close(fd);
    return buf;
  }
  for (;;) {
    if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r <= 0) break;
    n += (size_t)r;
  }
  buf[n] = 0;
  close(fd);
  return buf;
}

/* Waits for the child's "serving the page on http://127.0.0.1:N/" line; N, or -1. */
static int wait_serving(Child *c) {
  for (int i = 0; i < 6000; i++) {
    char *err = slurp(c->err);
    const char *s = strstr(err, "serving the page on http://127.0.0.1:");
    int port = -1;
    if (s) sscanf(s, "serving the page on http://127.0.0.1:%d/", &port);
    free(err);
    if (port > 0) return port;
    if (waitpid(c->pid, NULL, WNOHANG) == c->pid) return -1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

TEST(serve_answers_its_own_paths_until_interrupted) {
  const char *env[] = {"VIZ=1", "PORT=0", NULL};
  Child c = child_start("serve", env);
  int port = wait_serving(&c);
  CHECK_MSG(port > 0, "no 'serving' line");
  if (port <= 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, NULL, 0);
    return;
  }
  /* a client that sends its request a byte a second is dropped 5 s after it connected (the limit
   * was 5 s per byte, so such a client held the one-connection server for hours) */
  {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    struct timespec one = {1, 0};
    double t0 = tt_now_s();
    bool closed = false;
    for (int i = 0; i < 12 && !closed; i++) {
      if (send(fd, "G", 1, MSG_NOSIGNAL) != 1) closed = true;
      nanosleep(&one, NULL);
      char ch;
      if (!closed && recv(fd, &ch, 1, MSG_DONTWAIT) == 0) closed = true;
    }
    double secs = tt_now_s() - t0;
    CHECK_MSG(closed && secs < 8.5, "a trickling client: %s after %.1f s", closed ? "dropped" : "still connected", secs);
    close(fd);
  }
  char *r = http(port, "GET / HTTP/1.0\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 200 OK\r\n");
  CHECK_HAS(r, "Content-Type: text/html");
  CHECK_HAS(r, "<title>tinygrad.c VIZ</title>");
  free(r);
  r = http(port, "GET /data.js?x=1 HTTP/1.1\r\nHost: localhost\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 200 OK\r\n");
  CHECK_HAS(r, "window.TG_VIZ = {");
  CHECK_HAS(r, "\"src\": \"");
  free(r);
  /* a request another site's page made: a rebound name in Host, or a browser's cross-site fetch
   * (a script tag reading data.js) */
  r = http(port, "GET /data.js HTTP/1.1\r\nHost: evil.example:8000\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 403 Forbidden\r\n");
  CHECK(!strstr(r, "TG_VIZ"));
  free(r);
  r = http(port, "GET /data.js HTTP/1.1\r\nHost: 127.0.0.1\r\nSec-Fetch-Site: cross-site\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 403 Forbidden\r\n");
  free(r);
  /* a request line longer than the head buffer pushed those headers out of it, and they passed */
  {
    static char lr[9200];
    int n = snprintf(lr, sizeof lr, "GET /data.js?");
    memset(lr + n, 'A', 9000);
    snprintf(lr + n + 9000, sizeof lr - (size_t)n - 9000, " HTTP/1.1\r\nHost: evil.example\r\nSec-Fetch-Site: cross-site\r\n\r\n");
    r = http(port, lr);
    CHECK_HAS(r, "HTTP/1.0 431 Request Header Fields Too Large\r\n");
    CHECK(!strstr(r, "TG_VIZ"));
    free(r);
  }
  r = http(port, "GET /data.js HTTP/1.1\r\nhost: LOCALHOST:1\r\nsec-fetch-site: same-origin\r\n\r\n");
  CHECK_HAS(r, "window.TG_VIZ = {");
  free(r);
  r = http(port, "GET /viz.js HTTP/1.0\r\n\r\n");
  CHECK_HAS(r, "text/javascript");
  free(r);
  const char *bad[] = {"GET /../../../etc/passwd HTTP/1.0\r\n\r\n",
                       "GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.0\r\n\r\n",
                       "GET /index.html/../../x HTTP/1.0\r\n\r\n", "GET //etc/passwd HTTP/1.0\r\n\r\n",
                       "GET http://127.0.0.1/etc/passwd HTTP/1.0\r\n\r\n"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r = http(port, bad[i]);
    CHECK_MSG(strstr(r, "HTTP/1.0 404 Not Found\r\n") && !strstr(r, "root:"), "%s -> %.80s", bad[i], r);
    CHECK_HAS(r, "not found: ");
    free(r);
  }
  r = http(port, "POST / HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 405 Method Not Allowed\r\n");
  CHECK_HAS(r, "Allow: GET");
  free(r);
  r = http(port, "garbage\r\n\r\n");
  CHECK_HAS(r, "HTTP/1.0 400 Bad Request");
  free(r);
  /* only loopback: the listening socket is bound to 127.0.0.1 (checked from /proc/net/tcp: the
   * local address of the port's LISTEN line is 0100007F) */
  char *tcp = slurp("/proc/net/tcp"), want[64];
  snprintf(want, sizeof want, "0100007F:%04X 00000000:0000 0A", port);
  CHECK_HAS(tcp, want);
  free(tcp);
  kill(c.pid, SIGINT);
  int rc = child_wait(&c, 20);
  CHECK_MSG(rc == 0, "after SIGINT the child exited with %d", rc);
  char *err = slurp(c.err), *out = slurp(c.out);
  CHECK_HAS(err, "VIZ: stopped serving");
  CHECK(strcmp(out, plain()) == 0);
  free(err), free(out);
}

TEST(port_in_use_is_a_clear_error) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0);
  int port = ntohs(a.sin_port);
  char env1[64], env2[420], dir[400];
  snprintf(env1, sizeof env1, "PORT=%d", port);
  snprintf(dir, sizeof dir, "%s/fallback", tmpdir());
  snprintf(env2, sizeof env2, "VIZ_DIR=%s", dir);
  const char *env[] = {"VIZ=1", env1, env2, NULL};
  Child c = child_start("inuse", env);
  int rc = child_wait(&c, 60);
  close(fd);
  CHECK_MSG(rc == 0, "child exited with %d", rc);
  char *err = slurp(c.err);
  char want[128];
  snprintf(want, sizeof want,
           "VIZ: cannot serve on 127.0.0.1:%d: the port is in use (set PORT to a free port", port);
  CHECK_HAS(err, want);
  CHECK_HAS(err, "VIZ: wrote the page to"); /* nothing recorded is lost */
  free(err);
  const char *env3[] = {"VIZ=1", "PORT=99999", env2, NULL};
  Child c2 = child_start("badport", env3);
  CHECK(child_wait(&c2, 60) == 0);
  err = slurp(c2.err);
  CHECK_HAS(err, "VIZ: PORT=99999 is not a port number");
  free(err);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--child") == 0) return child_main();
  ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (n <= 0) {
    perror("readlink /proc/self/exe");
    return 2;
  }
  self_path[n] = 0;
  int rc = RUN_TESTS();
  free(plain_output);
  tmpdir_remove();
  return rc;
}
