/*
 * viz_serve.c -- writes the VIZ page's files to a directory, or serves them: a small HTTP/1.0 server
 * on 127.0.0.1 that answers GET for the page's own five paths (/, /index.html, /viz.js, /viz.css,
 * /data.js) -- names are compared whole, so no request reaches the file system -- 404 for any other
 * path, 405 for any other method, 403 for a request another site's page made (Host, Sec-Fetch-Site),
 * one connection at a time, each bounded in time, until SIGINT or SIGTERM.
 */
#include "viz_serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../helpers.h"
#include "../savefile.h"

extern char **environ;

/* the page's files (build/gen/viz_assets.c, made from src/engine/viz_page/) */
extern const char viz_page_index_html[], viz_page_viz_js[], viz_page_viz_css[];

/* A file of the page (or a scratch file): written through no symbolic link (one planted where the
 * page goes, in a shared directory, would have the page written over its target) and only as a
 * regular file (O_NONBLOCK: a FIFO there fails instead of waiting for a reader). */
bool viz_write_file(const char *path, const char *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) return false;
  struct stat st;
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok) errno = EINVAL;
  ok = ok && ftruncate(fd, 0) == 0;
  for (size_t done = 0; ok && done < len;) {
    ssize_t w = write(fd, data + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    ok = w > 0;
    if (ok) done += (size_t)w;
  }
  int e = errno;
  ok = close(fd) == 0 && ok;
  if (!ok && e) errno = e;
  return ok;
}

/* Runs argv with stdin from in_path (NULL: /dev/null), stdout to out_path and stderr to err_path.
 * Returns the exit status, 127 if the program could not be started, -1 if it died. */
int viz_spawn(char *const argv[], const char *in_path, const char *out_path, const char *err_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in_path ? in_path : "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc != 0 ? -1 : (int)pid;
}

int viz_wait(int pid) {
  if (pid < 0) return 127;
  int status;
  while (waitpid((pid_t)pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int viz_wait_until(int pid, double deadline) {
  if (pid < 0 || deadline <= 0) return viz_wait(pid);
  int status;
  for (;;) {
    pid_t r = waitpid((pid_t)pid, &status, WNOHANG);
    if (r == (pid_t)pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0 && errno != EINTR) return -1;
    if (now_seconds() >= deadline) {
      kill((pid_t)pid, SIGKILL);
      while (waitpid((pid_t)pid, &status, 0) < 0 && errno == EINTR) {
      }
      return VIZ_TIMED_OUT;
    }
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
}

int viz_run_program(char *const argv[], const char *in_path, const char *out_path, const char *err_path) {
  return viz_wait(viz_spawn(argv, in_path, out_path, err_path));
}

/* ---- the page's files --------------------------------------------------------------------------- */

void viz_page_make(VizPage *p, char *data) {
  p->data = data;
  p->files[0] = (VizPageFile){"index.html", "text/html; charset=utf-8", viz_page_index_html,
                              strlen(viz_page_index_html)};
  p->files[1] =
      (VizPageFile){"viz.js", "text/javascript; charset=utf-8", viz_page_viz_js, strlen(viz_page_viz_js)};
  p->files[2] =
      (VizPageFile){"viz.css", "text/css; charset=utf-8", viz_page_viz_css, strlen(viz_page_viz_css)};
  p->files[3] = (VizPageFile){"data.js", "text/javascript; charset=utf-8", p->data, strlen(p->data)};
}

/* Writes the page's files into dir (created if missing). false with *why set on failure. */
static bool page_write(const VizPage *p, const char *dir, char *why, size_t whylen) {
  struct stat st;
  if (stat(dir, &st) != 0) {
    if (mkdir(dir, 0755) != 0) {
      snprintf(why, whylen, "cannot create the directory: %s", strerror(errno));
      return false;
    }
  } else if (!S_ISDIR(st.st_mode)) {
    snprintf(why, whylen, "it exists and is not a directory");
    return false;
  }
  for (int i = 0; i < 4; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, p->files[i].path);
    /* only a regular file is replaced (a link planted in a shared directory is not written
     * through), and through a new temporary file renamed over it: a failed write (a full disk, a
     * file size limit) leaves the previous page's file whole, not cut short. (A link planted after
     * the check is replaced by the rename, never followed.) */
    struct stat ps;
    if (lstat(path, &ps) == 0 && !S_ISREG(ps.st_mode)) {
      snprintf(why, whylen, "cannot write %s: it is %s, not a regular file", path, file_kind(ps.st_mode));
      return false;
    }
    char tmp[4200];
    int fd = -1;
    for (int n = 0; n < 100 && fd < 0; n++) { /* (a name left or planted there is skipped) */
      snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld.%d", dir, p->files[i].path, (long)getpid(), n);
      fd = file_create_new(tmp, 0644);
      if (fd < 0 && errno != EEXIST) break;
    }
    bool ok = fd >= 0 && fd_write_all(fd, p->files[i].data, p->files[i].len);
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) {
      if (fd >= 0) unlink(tmp);
      snprintf(why, whylen, "cannot write %s: %s (the previous file, if any, is kept)", path, strerror(e));
      return false;
    }
  }
  return true;
}

/* VIZ_DIR, or a new temporary directory. Prints where the page is. */
void viz_page_write_dir(const VizPage *p) {
  const char *dir = getenv("VIZ_DIR");
  char *made = NULL;
  if (!dir || !*dir) {
    const char *tmp = getenv("TMPDIR");
    SB d;
    sb_init(&d);
    sb_printf(&d, "%s/tinygrad-viz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    made = sb_take(&d);
    if (!mkdtemp(made)) {
      fprintf(stderr,
              "VIZ: cannot create a temporary directory %s: %s (set VIZ_DIR to a writable directory)\n", made,
              strerror(errno));
      free(made);
      return;
    }
    dir = made;
  }
  char why[4200];
  if (page_write(p, dir, why, sizeof why)) {
    char abs[4096];
    if (!realpath(dir, abs)) snprintf(abs, sizeof abs, "%s", dir);
    fprintf(stderr, "VIZ: wrote the page to %s/index.html (open file://%s/index.html in a browser)\n", abs,
            abs);
  } else {
    fprintf(stderr, "VIZ: cannot write the page to VIZ_DIR=%s: %s (set VIZ_DIR to a writable directory)\n",
            dir, why);
  }
  free(made);
}

/* ---- the server --------------------------------------------------------------------------------- */

static volatile sig_atomic_t stop_serving;
static void on_stop(int sig) {
  (void)sig;
  stop_serving = 1;
}

/* Milliseconds left until deadline (a now_seconds() time), at least 0. */
static int ms_left(double deadline) {
  double l = (deadline - now_seconds()) * 1000.0;
  return l <= 0 ? 0 : l > 1e9 ? 1000000000 : (int)l;
}

/* Sends until done, the deadline passes (a client that stops reading holds the server no longer)
 * or a stop is asked for. */
static void send_all(int fd, const char *data, size_t len, double deadline) {
  while (len && !stop_serving) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int r = poll(&pf, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    ssize_t w = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (w <= 0) return;
    data += w;
    len -= (size_t)w;
  }
}

static void respond(int fd, int code, const char *status, const char *type, const char *body, size_t len,
                    const char *extra) {
  char head[512];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                   "X-Content-Type-Options: nosniff\r\n%sConnection: close\r\n\r\n",
                   code, status, type, len, extra ? extra : "");
  /* 10 s, and 1 s more per MiB: time enough for a browser on this machine */
  double deadline = now_seconds() + 10.0 + (double)len / (1 << 20);
  send_all(fd, head, (size_t)n, deadline);
  send_all(fd, body, len, deadline);
}

/* The value of header `name` in the request head req (case-insensitive name; the value's leading
 * blanks skipped, up to the end of the line) into out; false if absent. */
static bool header(const char *req, const char *name, char *out, size_t outlen) {
  size_t nl = strlen(name);
  for (const char *l = strchr(req, '\n'); l; l = strchr(l + 1, '\n')) {
    if (strncasecmp(l + 1, name, nl) != 0 || l[1 + nl] != ':') continue;
    const char *v = l + 2 + nl;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strcspn(v, "\r\n");
    if (n >= outlen) n = outlen - 1;
    memcpy(out, v, n);
    out[n] = 0;
    return true;
  }
  return false;
}

/* Is the request one this machine's browser made for the page itself? A Host header must name the
 * loopback address or localhost (a page elsewhere that rebinds its name to 127.0.0.1 sends its own
 * name), and a browser's Sec-Fetch-Site must say same-origin or none (typed in): another site's page
 * loading data.js with a script tag would read the recorded program (XSSI). */
static bool request_allowed(const char *req) {
  char v[256];
  if (header(req, "Host", v, sizeof v)) {
    v[strcspn(v, ":")] = 0; /* the name; the port does not matter */
    if (strcmp(v, "127.0.0.1") != 0 && strcasecmp(v, "localhost") != 0) return false;
  }
  if (header(req, "Sec-Fetch-Site", v, sizeof v) && strcasecmp(v, "same-origin") != 0 && strcasecmp(v, "none") != 0)
    return false;
  return true;
}

/* One request: reads its head (at most 8 KiB, within 5 s in all: a client sending a byte at a time
 * holds the server no longer; a head that does not end within them is refused), answers GET for
 * the page's own paths. */
static void serve_one(const VizPage *p, int fd) {
  char req[8192];
  size_t got = 0;
  double deadline = now_seconds() + 5.0;
  while (got < sizeof req - 1 && !memmem(req, got, "\r\n\r\n", 4) && !memmem(req, got, "\n\n", 2)) {
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, ms_left(deadline));
    if (r < 0 && errno == EINTR) {
      if (stop_serving) return;
      continue;
    }
    if (r <= 0) return;
    ssize_t k = recv(fd, req + got, sizeof req - 1 - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  req[got] = 0;
  /* the head must end within the buffer: the checks below read headers that a longer request line
   * would push out of it (a 9 KB query string hid a foreign Host) */
  if (!memmem(req, got, "\r\n\r\n", 4) && !memmem(req, got, "\n\n", 2)) {
    if (got < sizeof req - 1) {
      const char *m = "bad request: the request head did not end\n";
      respond(fd, 400, "Bad Request", "text/plain; charset=utf-8", m, strlen(m), NULL);
      return;
    }
    const char *m = "request head too large: this server reads at most 8 KiB\n";
    respond(fd, 431, "Request Header Fields Too Large", "text/plain; charset=utf-8", m, strlen(m), NULL);
    /* read what the client still sends (for at most 1 s, 1 MiB), so that closing with it unread
     * does not reset the connection before the client reads the answer */
    shutdown(fd, SHUT_WR);
    double end = now_seconds() + 1.0;
    for (size_t drained = 0; drained < (1u << 20);) {
      struct pollfd pf = {fd, POLLIN, 0};
      if (poll(&pf, 1, ms_left(end)) <= 0) break;
      ssize_t k = recv(fd, req, sizeof req, 0);
      if (k <= 0) break;
      drained += (size_t)k;
    }
    return;
  }
  char method[16], target[2048];
  if (sscanf(req, "%15s %2047s", method, target) != 2) {
    const char *m = "bad request\n";
    respond(fd, 400, "Bad Request", "text/plain; charset=utf-8", m, strlen(m), NULL);
    return;
  }
  if (!request_allowed(req)) {
    const char *m = "forbidden: this server answers its own page, opened at http://127.0.0.1 or localhost\n";
    respond(fd, 403, "Forbidden", "text/plain; charset=utf-8", m, strlen(m), NULL);
    return;
  }
  if (strcmp(method, "GET") != 0) {
    char m[128];
    int n = snprintf(m, sizeof m, "method %s not allowed: this server answers GET only\n", method);
    respond(fd, 405, "Method Not Allowed", "text/plain; charset=utf-8", m, (size_t)n, "Allow: GET\r\n");
    return;
  }
  char *q = strpbrk(target, "?#");
  if (q) *q = 0;
  const char *name = strcmp(target, "/") == 0 ? "index.html" : target[0] == '/' ? target + 1 : NULL;
  for (int i = 0; name && i < 4; i++)
    if (strcmp(name, p->files[i].path) == 0) {
      respond(fd, 200, "OK", p->files[i].type, p->files[i].data, p->files[i].len, NULL);
      return;
    }
  SB m;
  sb_init(&m);
  sb_puts(&m, "not found: ");
  for (const char *c = target; *c && m.len < 300; c++) sb_putc(&m, (*c >= 0x20 && *c < 0x7f) ? *c : '?');
  sb_puts(&m, " (this server answers /, /index.html, /viz.js, /viz.css and /data.js)\n");
  respond(fd, 404, "Not Found", "text/plain; charset=utf-8", m.s, m.len, NULL);
  sb_free(&m);
}

/* Serves p on 127.0.0.1:port until SIGINT or SIGTERM. false (message printed) if it cannot listen. */
bool viz_page_serve(const VizPage *p, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "VIZ: cannot create a socket: %s\n", strerror(errno));
    return false;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    if (e == EADDRINUSE)
      fprintf(stderr,
              "VIZ: cannot serve on 127.0.0.1:%d: the port is in use (set PORT to a free port, or VIZ=-1 to "
              "write the page to a directory)\n",
              port);
    else
      fprintf(stderr, "VIZ: cannot serve on 127.0.0.1:%d: %s\n", port, strerror(e));
    close(fd);
    return false;
  }
  socklen_t al = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &al);
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  stop_serving = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  fprintf(stderr, "VIZ: serving the page on http://127.0.0.1:%d/ (Ctrl-C stops)\n", ntohs(a.sin_port));
  while (!stop_serving) {
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, 500);
    if (r <= 0) continue;
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    serve_one(p, c);
    shutdown(c, SHUT_WR);
    close(c);
  }
  close(fd);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  fprintf(stderr, "VIZ: stopped serving\n");
  return true;
}
