/*
 * viz_serve.h -- the VIZ page's files (index.html, viz.js, viz.css and the data, data.js): written to
 * a directory, or served over HTTP/1.0 on a loopback port. Kept apart from viz.c, whose engine
 * headers clash with <signal.h>.
 */
#ifndef TG_VIZ_SERVE_H
#define TG_VIZ_SERVE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  const char *path, *type; /* "viz.js", its Content-Type */
  const char *data;
  size_t len;
} VizPageFile;

typedef struct {
  VizPageFile files[4];
  char *data; /* data.js (owned: the caller frees it) */
} VizPage;

/* The page with data.js = data (taken). */
void viz_page_make(VizPage *p, char *data);
/* Writes the page to $VIZ_DIR (created if missing), or to a new temporary directory; prints where
 * it went, or why it could not (never fails otherwise). */
void viz_page_write_dir(const VizPage *p);
/* Serves the page on 127.0.0.1:port (0: any free port) until SIGINT or SIGTERM; prints the address
 * on stderr. false, with the reason printed, when it cannot listen (the port is in use). */
bool viz_page_serve(const VizPage *p, int port);

/* Writes len bytes to path (created or truncated); false on any failure (errno says why). */
bool viz_write_file(const char *path, const char *data, size_t len);
/* Runs argv (no shell; argv[0] looked up in PATH) with stdin from in_path (NULL: /dev/null), stdout
 * to out_path and stderr to err_path. The exit status; 127 if it could not start, -1 if it died. */
int viz_run_program(char *const argv[], const char *in_path, const char *out_path, const char *err_path);
/* The same in two steps: start it (its pid, -1 if it could not start), and wait for it (its exit
 * status as above; 127 for pid -1). */
int viz_spawn(char *const argv[], const char *in_path, const char *out_path, const char *err_path);
int viz_wait(int pid);
/* viz_wait with a deadline (CLOCK_MONOTONIC seconds; <= 0: none): past it the program is killed and
 * VIZ_TIMED_OUT returned. */
#define VIZ_TIMED_OUT (-3)
int viz_wait_until(int pid, double deadline);

#endif
