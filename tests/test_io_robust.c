/*
 * test_io_robust.c -- model files and unusual paths: what the loaders and tg_safe_save do with
 * FIFOs, symbolic links and directories, metadata set from its own value, and tensors from
 * tg_safe_load_mmap that outlive their dict.
 *
 *  - tg_safe_save never replaces a node that is not a regular file (a FIFO, a directory; also
 *    behind a symbolic link): it fails naming the path and leaves everything as it was. Through a
 *    symbolic link (relative, absolute, a chain, a dangling one) it writes the file the link leads
 *    to and the link stays a link; a link loop is an error. A failed save leaves an existing regular
 *    file intact (through a link too) and no temporary file behind.
 *  - Every file loader refuses a FIFO at once (no blocking open, no endless read) with an error
 *    naming the function and the path; a watchdog turns a hang into a failure.
 *  - Temporary files of saves killed before their rename ("PATH.tmp.PID.N") are removed by the next
 *    save to PATH when their process is gone; those of live processes, and look-alikes, stay.
 *  - tg_state_dict_meta_set with the value tg_state_dict_meta_get returned for the same key.
 *  - Lazy results of tg_safe_load_mmap's tensors, and detached handles, still read the file after the
 *    dict is freed; the mapping goes away with the last of them.
 *  - A file that changes while it is loaded: truncated between the stages of a load (a hook in the
 *    loaders), every loader reports TG_ERR_IO; rewritten in place by another process over and over
 *    while the copying loaders load it, every load succeeds or fails cleanly (no SIGBUS). For
 *    tg_safe_load_mmap the documented limits: a same-size rewrite shows through the tensors, and a
 *    truncation under a live tensor raises SIGBUS when it is read (in a child process).
 * Everything happens in a fresh temporary directory.
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nn/state_dict.h" /* io_test_hook */
#include "test.h"
#include "tinygrad.h"


static void write_text(const char *path, const char *s) {
  FILE *f = fopen(path, "wb");
  if (!f || fputs(s, f) < 0 || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

/* The whole file as a string (static buffer; "" if unreadable). */
static const char *read_text(const char *path) {
  static char buf[256];
  buf[0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static bool is_fifo(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0 && S_ISFIFO(st.st_mode);
}
static bool is_link(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
}
static bool is_regular(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Entries of the temporary directory whose name contains ".tmp." (tg_safe_save's temporary files). */
static int temp_files_left(void) {
  DIR *d = opendir(tmpdir());
  int n = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".tmp.")) n++;
  closedir(d);
  return n;
}

static void make_fifo(const char *p) {
  unlink(p);
  if (mkfifo(p, 0644) != 0) {
    perror("mkfifo");
    exit(2);
  }
}

/* A dict {"w": [1, 2, 3, 4] float32 + v} with metadata, for saving. */
static tg_state_dict *small_dict(float v) {
  const float x[] = {1 + v, 2 + v, 3 + v, 4 + v};
  tg_state_dict *sd = tg_state_dict_new();
  tg_scope_begin();
  tg_state_dict_set(sd, "w", tg_from_data(x, TG_SHAPE(4), TG_OPTS(.dtype = TG_FLOAT32)));
  tg_scope_end();
  tg_state_dict_meta_set(sd, "format", "pt");
  return sd;
}

/* True if path loads as small_dict(v). */
static bool holds_dict(const char *path, float v) {
  tg_state_dict *sd = tg_safe_load(path);
  if (!sd) {
    fprintf(stderr, "  cannot load %s: %s\n", path, tg_last_error() ? tg_last_error() : "?");
    tg_clear_error();
    return false;
  }
  float got[4] = {0};
  tg_tensor w = tg_state_dict_get(sd, "w");
  bool ok = tg_numel(w) == 4 && tg_data(w, got, sizeof got) == TG_OK;
  for (int i = 0; i < 4 && ok; i++) ok = got[i] == (float)(i + 1) + v;
  tg_state_dict_free(sd);
  return ok;
}

/* The error message of the last failure, cleared (static copy). */
static const char *take_error(void) {
  static char buf[1024];
  snprintf(buf, sizeof buf, "%s", tg_last_error() ? tg_last_error() : "(no error)");
  tg_clear_error();
  return buf;
}

TEST(safe_save_refuses_fifo) {
  const char *fifo = tpath("save.fifo");
  make_fifo(fifo);
  tg_state_dict *sd = small_dict(0);
  tg_status st = tg_safe_save(sd, fifo);
  CHECK(st == TG_ERR_IO);
  char want[600];
  snprintf(want, sizeof want, "tg_safe_save: %s is not a regular file (a FIFO)", fifo);
  CHECK_STR_CONTAINS(take_error(), want);
  CHECK(is_fifo(fifo)); /* still the FIFO, not a regular file renamed over it */
  CHECK(temp_files_left() == 0);
  /* a directory is refused the same way */
  const char *dir = tpath("save.dir");
  CHECK(mkdir(dir, 0755) == 0);
  CHECK(tg_safe_save(sd, dir) == TG_ERR_IO);
  CHECK_STR_CONTAINS(take_error(), "is not a regular file (a directory)");
  struct stat s;
  CHECK(lstat(dir, &s) == 0 && S_ISDIR(s.st_mode));
  CHECK(temp_files_left() == 0);
  tg_state_dict_free(sd);
  rmdir(dir);
  unlink(fifo);
  CHECK(tg_live_count() == 0);
}

/* A file its owner made read-only is not replaced (Python's open(path, "wb"), which tinygrad's
 * safe_save and torch.save use, refuses it; the rename only needed the directory's permission), and
 * root saving over another user's file leaves it theirs. As root, the read-only case runs in a child
 * that drops to nobody (root may write any file). */
TEST(safe_save_read_only_and_owner) {
  /* (a directory of its own in /tmp: the tests' directory is root's alone, which nobody cannot enter) */
  char dir[512] = "/tmp/tg-test-ro-XXXXXX";
  CHECK(mkdtemp(dir) != NULL && chmod(dir, 0777) == 0);
  char path[600];
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  pid_t pid = fork();
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
    tg_state_dict *sd = small_dict(0);
    if (tg_safe_save(sd, path) != TG_OK || chmod(path, 0444) != 0) _exit(4);
    tg_state_dict *sd2 = small_dict(5);
    tg_status st = tg_safe_save(sd2, path);
    bool said = tg_last_error() && strstr(tg_last_error(), "Permission denied (mode 444)") && strstr(tg_last_error(), "nothing was written");
    bool kept = holds_dict(path, 0);
    tg_state_dict_free(sd), tg_state_dict_free(sd2);
    _exit(st == TG_ERR_IO && said && kept ? 0 : 5);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  if (geteuid() == 0) {
    /* root replacing nobody's file: the new file is still nobody's, with its mode */
    CHECK(chmod(path, 0640) == 0 && chown(path, 65534, 65534) == 0);
    tg_state_dict *sd = small_dict(7);
    CHECK(tg_safe_save(sd, path) == TG_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534 && (st.st_mode & 0777) == 0640);
    CHECK(holds_dict(path, 7));
    tg_state_dict_free(sd);
  }
  unlink(path);
  CHECK(rmdir(dir) == 0); /* (empty: no temporary file left beside the target) */
}

TEST(safe_save_through_symlinks) {
  tg_state_dict *sd = small_dict(0);
  /* an absolute link to an existing file: the file gets the data, the link stays */
  const char *target = tpath("target.safetensors"), *link = tpath("abs.link");
  write_text(target, "OLD");
  chmod(target, 0600);
  unlink(link);
  CHECK(symlink(target, link) == 0);
  CHECK(tg_safe_save(sd, link) == TG_OK);
  CHECK(is_link(link));
  CHECK(is_regular(target));
  CHECK(holds_dict(target, 0));
  struct stat s;
  CHECK(stat(target, &s) == 0 && (s.st_mode & 07777) == 0600); /* the target's permissions are kept */
  /* a chain of relative links (link2 -> rel.link -> target.safetensors) */
  tg_state_dict *sd2 = small_dict(10);
  const char *rel = tpath("rel.link"), *link2 = tpath("chain.link");
  unlink(rel);
  unlink(link2);
  CHECK(symlink("target.safetensors", rel) == 0);
  CHECK(symlink("rel.link", link2) == 0);
  CHECK(tg_safe_save(sd2, link2) == TG_OK);
  CHECK(is_link(link2) && is_link(rel) && is_regular(target));
  CHECK(holds_dict(target, 10));
  /* a dangling link: the file it names is created */
  const char *fresh = tpath("fresh.safetensors"), *dangling = tpath("dangling.link");
  unlink(fresh);
  unlink(dangling);
  CHECK(symlink("fresh.safetensors", dangling) == 0);
  CHECK(tg_safe_save(sd, dangling) == TG_OK);
  CHECK(is_link(dangling) && is_regular(fresh));
  CHECK(holds_dict(fresh, 0));
  CHECK(temp_files_left() == 0);
  /* a link to a FIFO: refused, both stay as they are */
  const char *fifo = tpath("linked.fifo"), *flink = tpath("fifo.link");
  make_fifo(fifo);
  unlink(flink);
  CHECK(symlink("linked.fifo", flink) == 0);
  CHECK(tg_safe_save(sd, flink) == TG_ERR_IO);
  char want[600];
  snprintf(want, sizeof want, "tg_safe_save: %s is not a regular file (a symbolic link to", flink);
  CHECK_STR_CONTAINS(take_error(), want);
  CHECK(is_link(flink) && is_fifo(fifo));
  CHECK(temp_files_left() == 0);
  /* a loop of links is an error, not a hang */
  const char *l1 = tpath("loop1.link"), *l2 = tpath("loop2.link");
  unlink(l1);
  unlink(l2);
  CHECK(symlink("loop2.link", l1) == 0 && symlink("loop1.link", l2) == 0);
  CHECK(tg_safe_save(sd, l1) == TG_ERR_IO);
  CHECK_STR_CONTAINS(take_error(), "too many levels of symbolic links");
  CHECK(is_link(l1) && is_link(l2));
  /* a save that fails leaves the file (and the link to it) as they were */
  write_text(target, "KEEP");
  tg_scope_begin();
  tg_state_dict_set(sd, "__metadata__", tg_zeros(TG_SHAPE(1), NULL)); /* a name safetensors reserves */
  tg_scope_end();
  CHECK(tg_safe_save(sd, link) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(take_error(), "__metadata__");
  CHECK(tg_safe_save(sd, target) == TG_ERR_INVALID);
  CHECK_STR_CONTAINS(take_error(), "__metadata__");
  CHECK(is_link(link) && is_regular(target) && strcmp(read_text(target), "KEEP") == 0);
  CHECK(temp_files_left() == 0);
  tg_state_dict_free(sd);
  tg_state_dict_free(sd2);
  CHECK(tg_live_count() == 0);
}

TEST(meta_set_own_value) {
  tg_state_dict *sd = tg_state_dict_new();
  const char *v = "a metadata value longer than the allocator's free-list pointers";
  CHECK(tg_state_dict_meta_set(sd, "k", v) == TG_OK);
  CHECK(tg_state_dict_meta_set(sd, "k", tg_state_dict_meta_get(sd, "k")) == TG_OK);
  const char *got = tg_state_dict_meta_get(sd, "k");
  CHECK_MSG(got && strcmp(got, v) == 0, "got '%s'", got ? got : "(null)");
  CHECK(tg_state_dict_meta_len(sd) == 1);
  tg_state_dict_free(sd);
}

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "  FAIL: a loader blocked on a FIFO (watchdog)\n";
  if (write(2, msg, sizeof msg - 1) < 0) { /* nothing more to do */
  }
  _exit(1);
}

TEST(loaders_refuse_fifo) {
  const char *fifo = tpath("load.fifo");
  make_fifo(fifo);
  signal(SIGALRM, watchdog);
  alarm(60); /* an open() that waits for a writer, or a read that never ends, fails the test */
  struct {
    const char *name;
    tg_state_dict *(*fn)(const char *);
  } loaders[] = {{"tg_safe_load", tg_safe_load},
                 {"tg_safe_load_mmap", tg_safe_load_mmap},
                 {"tg_gguf_load", tg_gguf_load},
                 {"tg_tar_extract", tg_tar_extract},
                 {"tg_torch_load", tg_torch_load}};
  char want[600];
  for (size_t i = 0; i < sizeof loaders / sizeof loaders[0]; i++) {
    tg_state_dict *sd = loaders[i].fn(fifo);
    CHECK_MSG(sd == NULL, "%s", loaders[i].name);
    tg_state_dict_free(sd);
    CHECK(tg_last_status() == TG_ERR_IO);
    snprintf(want, sizeof want, "%s: %s is not a regular file (a FIFO)", loaders[i].name, fifo);
    CHECK_STR_CONTAINS(take_error(), want);
  }
  tg_tensor t = tg_idx_load(fifo);
  CHECK(t.id == 0);
  CHECK(tg_last_status() == TG_ERR_IO);
  snprintf(want, sizeof want, "tg_idx_load: %s is not a regular file (a FIFO)", fifo);
  CHECK_STR_CONTAINS(take_error(), want);
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  CHECK(is_fifo(fifo));
  unlink(fifo);
  CHECK(tg_live_count() == 0);
}

/* Mappings of `path` in this process (-1 if /proc/self/maps cannot be read). */
static int mappings_of(const char *path) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, path)) n++;
  fclose(f);
  return n;
}

TEST(mmap_tensors_outlive_dict) {
  const char *path = tpath("mapped.safetensors");
  tg_state_dict *src = small_dict(0);
  CHECK(tg_safe_save(src, path) == TG_OK);
  tg_state_dict_free(src);
  tg_scope_begin();
  tg_state_dict *sd = tg_safe_load_mmap(path);
  CHECK(sd != NULL);
  if (!sd) {
    tg_scope_end();
    return;
  }
  tg_tensor w = tg_state_dict_get(sd, "w");
  tg_tensor y = tg_mul_s(tg_add_s(w, 1), 2); /* lazy: reads the mapping when realized */
  tg_tensor d = tg_detach(w);                /* a handle of the caller's own */
  int before = mappings_of(path);
  tg_state_dict_free(sd);
  if (before > 0) CHECK(mappings_of(path) == before); /* still mapped: y and d read it */
  float got[4] = {0};
  CHECK(tg_data(y, got, sizeof got) == TG_OK);
  for (int i = 0; i < 4; i++) CHECK(got[i] == (float)(i + 2) * 2);
  CHECK(tg_data(d, got, sizeof got) == TG_OK);
  for (int i = 0; i < 4; i++) CHECK(got[i] == (float)(i + 1));
  tg_scope_end();
  if (before > 0) CHECK(mappings_of(path) == 0); /* unmapped with the last tensor that read it */
  CHECK(tg_live_count() == 0);
  /* with no tensor left outside the dict, freeing the dict unmaps the file */
  CHECK(tg_state_dict_len(sd = tg_safe_load_mmap(path)) == 1);
  tg_state_dict_free(sd);
  if (before > 0) CHECK(mappings_of(path) == 0);
}


/* The pid of a process that existed and is gone (forked, exited, reaped). */
static pid_t dead_pid(void) {
  pid_t p = fork();
  if (p == 0) _exit(0);
  if (p > 0) waitpid(p, NULL, 0);
  return p;
}

TEST(safe_save_removes_temps_of_dead_processes) {
  tg_state_dict *sd = small_dict(3);
  const char *path = tpath("leftover.safetensors");
  pid_t dead1 = dead_pid(), dead2 = dead_pid();
  pid_t live = fork(); /* a process saving right now: its file must stay */
  if (live == 0) {
    pause();
    _exit(0);
  }
  CHECK(dead1 > 0 && dead2 > 0 && live > 0);
  char d1[600], d2[600], l1[600], own[600], other[600], odd1[600], odd2[600];
  snprintf(d1, sizeof d1, "%s.tmp.%d.0", path, (int)dead1);
  snprintf(d2, sizeof d2, "%s.tmp.%d.17", path, (int)dead2);
  snprintf(l1, sizeof l1, "%s.tmp.%d.0", path, (int)live);
  snprintf(own, sizeof own, "%s.tmp.%d.999", path, (int)getpid()); /* this process's own save */
  snprintf(other, sizeof other, "%s.tmp.%d.0", tpath("other.safetensors"), (int)dead1); /* another path's */
  snprintf(odd1, sizeof odd1, "%s.tmp.%d", path, (int)dead1);    /* not the pattern: no counter */
  snprintf(odd2, sizeof odd2, "%s.tmp.%dx.0", path, (int)dead1); /* not the pattern: not a pid */
  const char *all[] = {d1, d2, l1, own, other, odd1, odd2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) write_text(all[i], "partial model bytes");
  CHECK(tg_safe_save(sd, path) == TG_OK);
  CHECK(holds_dict(path, 3));
  CHECK_MSG(access(d1, F_OK) != 0, "%s (dead process) still there", d1);
  CHECK_MSG(access(d2, F_OK) != 0, "%s (dead process) still there", d2);
  CHECK_MSG(is_regular(l1), "%s (live process) was removed", l1);
  CHECK(is_regular(own) && is_regular(other) && is_regular(odd1) && is_regular(odd2));
  /* a directory named like a leftover is no file of a save: left alone */
  CHECK(mkdir(d1, 0755) == 0);
  CHECK(tg_safe_save(sd, path) == TG_OK);
  struct stat st;
  CHECK(lstat(d1, &st) == 0 && S_ISDIR(st.st_mode));
  rmdir(d1);
  kill(live, SIGKILL);
  waitpid(live, NULL, 0);
  /* now that it is gone, its leftover goes with the next save */
  CHECK(tg_safe_save(sd, path) == TG_OK);
  CHECK(access(l1, F_OK) != 0);
  for (size_t i = 3; i < sizeof all / sizeof all[0]; i++) unlink(all[i]);
  unlink(path);
  CHECK(temp_files_left() == 0);
  tg_state_dict_free(sd);
  CHECK(tg_live_count() == 0);
}

/* ---- files that change while they are loaded ---- */


static void write_bytes(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

/* A seed file of the fuzz corpus, next to this source file. */
static const char *corpus(const char *rel) {
  static char p[1024];
  const char *here = __FILE__, *slash = strrchr(here, '/');
  snprintf(p, sizeof p, "%.*s/fuzz_corpus/%s", slash ? (int)(slash - here) : 1, slash ? here : ".", rel);
  return p;
}

static int hook_stage = -1;
static off_t hook_size;
static void truncate_hook(const char *path, int stage) {
  if (stage == hook_stage && truncate(path, hook_size) != 0) perror("truncate");
}

typedef struct {
  const char *name, *file; /* the loader and a file it loads */
  tg_state_dict *(*fn)(const char *);
} Loader;

static const Loader k_loaders[] = {
    {"tg_safe_load", "changing.safetensors", tg_safe_load},
    {"tg_safe_load_mmap", "changing.safetensors", tg_safe_load_mmap},
    {"tg_gguf_load", "changing.gguf", tg_gguf_load},
    {"tg_tar_extract", "changing.tar", tg_tar_extract},
    {"tg_torch_load", "changing.pt", tg_torch_load},
};

/* Writes the sample file of each format under tpath(file); false if a corpus file is missing. */
static bool make_samples(void) {
  tg_state_dict *sd = tg_state_dict_new();
  tg_scope_begin();
  float big[16384];
  for (int i = 0; i < 16384; i++) big[i] = (float)i;
  tg_state_dict_set(sd, "w", tg_from_data(big, TG_SHAPE(16384), TG_OPTS(.dtype = TG_FLOAT32)));
  tg_scope_end();
  bool ok = tg_safe_save(sd, tpath("changing.safetensors")) == TG_OK;
  tg_state_dict_free(sd);
  const char *src[3][2] = {{"fuzz_gguf/plain.gguf", "changing.gguf"},
                           {"fuzz_tar/ustar.tar", "changing.tar"},
                           {"fuzz_torch_load/small.zip.pt", "changing.pt"}};
  for (int i = 0; i < 3 && ok; i++) {
    size_t n = 0;
    uint8_t *b = tt_read_file(corpus(src[i][0]), &n);
    ok = b && n > 0;
    CHECK_MSG(ok, "cannot read %s", corpus(src[i][0]));
    if (ok) write_bytes(tpath(src[i][1]), b, n);
    free(b);
  }
  return ok;
}

TEST(file_truncated_during_load) {
  if (!make_samples()) return;
  io_test_hook = truncate_hook;
  for (size_t i = 0; i < sizeof k_loaders / sizeof k_loaders[0]; i++) {
    const Loader *l = &k_loaders[i];
    char path[600];
    snprintf(path, sizeof path, "%s", tpath(l->file));
    size_t n = 0;
    uint8_t *orig = tt_read_file(path, &n);
    CHECK(orig != NULL);
    if (!orig) continue;
    tg_state_dict *sd = l->fn(path); /* unchanged: loads */
    CHECK_MSG(sd != NULL, "%s: %s", l->name, tg_last_error() ? tg_last_error() : "");
    tg_state_dict_free(sd);
    tg_clear_error();
    /* stage 0: after the loader learned the size, before it read anything; stage 1 (safetensors):
     * after the header was parsed, before the tensors were read */
    int last = strncmp(l->name, "tg_safe_load", 12) == 0 ? 1 : 0;
    for (int stage = 0; stage <= last; stage++) {
      for (int cut = 0; cut < 2; cut++) {
        write_bytes(path, orig, n);
        hook_stage = stage;
        hook_size = cut ? (off_t)(n / 2) : 0;
        sd = l->fn(path);
        hook_stage = -1;
        CHECK_MSG(sd == NULL, "%s loaded a file truncated to %lld bytes at stage %d", l->name,
                  (long long)hook_size, stage);
        tg_state_dict_free(sd);
        CHECK_MSG(tg_last_status() == TG_ERR_IO, "%s stage %d: status %d", l->name, stage, tg_last_status());
        const char *e = take_error();
        CHECK_MSG(strstr(e, l->name) && strstr(e, path) && strstr(e, "shrank"), "%s stage %d cut %d: %s",
                  l->name, stage, cut, e);
      }
    }
    write_bytes(path, orig, n);
    free(orig);
  }
  /* IDX (plain): read in parts too */
  const uint8_t idx[4 + 4 + 4096] = {0, 0, 0x08, 1, 0, 0, 0x10, 0};
  const char *ip = tpath("changing.idx");
  write_bytes(ip, idx, sizeof idx);
  hook_stage = 0;
  hook_size = 2000;
  tg_tensor t = tg_idx_load(ip);
  hook_stage = -1;
  CHECK(!t.id && tg_last_status() == TG_ERR_IO);
  CHECK_STR_CONTAINS(take_error(), "changed while it was read");
  io_test_hook = NULL;
  CHECK(tg_live_count() == 0);
}

/* Rewrites path with contents b[0..n) in place (truncate, then write in two parts) until killed. */
static void rewrite_forever(const char *path, const uint8_t *b, size_t n, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* if the loader crashes, this writer must not live on */
  if (getppid() != parent) _exit(0);
  for (;;) {
    int fd = open(path, O_WRONLY | O_TRUNC);
    if (fd < 0) _exit(3);
    size_t half = n / 2;
    if (write(fd, b, half) != (ssize_t)half) _exit(3);
    sched_yield();
    if (write(fd, b + half, n - half) != (ssize_t)(n - half)) _exit(3);
    close(fd);
  }
}

TEST(copying_loaders_survive_concurrent_rewrites) {
  if (!make_samples()) return;
  int ok = 0, failed = 0;
  for (size_t i = 0; i < sizeof k_loaders / sizeof k_loaders[0]; i++) {
    const Loader *l = &k_loaders[i];
    if (l->fn == tg_safe_load_mmap) continue; /* its limits are tested below */
    char path[600];
    snprintf(path, sizeof path, "%s", tpath(l->file));
    size_t n = 0;
    uint8_t *orig = tt_read_file(path, &n);
    CHECK(orig != NULL);
    if (!orig) continue;
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) rewrite_forever(path, orig, n, parent);
    double t0 = tt_now_s();
    do { /* a SIGBUS here kills the test */
      tg_state_dict *sd = l->fn(path);
      if (sd) {
        ok++;
        for (int k = 0; k < tg_state_dict_len(sd); k++) CHECK(tg_realize(tg_state_dict_tensor(sd, k)) == TG_OK);
        tg_state_dict_free(sd);
      } else {
        failed++;
        CHECK_MSG(tg_last_status() == TG_ERR_IO, "%s: %s", l->name, tg_last_error() ? tg_last_error() : "");
        const char *e = take_error();
        CHECK_MSG(strstr(e, l->name) && strstr(e, path), "%s", e);
      }
    } while (tt_now_s() - t0 < 0.4);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free(orig);
  }
  printf("  concurrent rewrites: %d loads succeeded, %d failed cleanly\n", ok, failed);
  CHECK(ok + failed > 0);
  CHECK(tg_live_count() == 0);
}

static void bus_exit(int sig) {
  (void)sig;
  _exit(77);
}

TEST(mmap_documented_limits) {
  if (!make_samples()) return;
  const char *path = tpath("changing.safetensors");
  size_t n = 0;
  uint8_t *orig = tt_read_file(path, &n);
  CHECK(orig != NULL);
  if (!orig) return;
  /* a same-size rewrite in place shows through a tensor that wraps the mapping */
  tg_state_dict *sd = tg_safe_load_mmap(path);
  CHECK(sd != NULL);
  if (sd) {
    tg_tensor w = tg_state_dict_get(sd, "w");
    static float got[16384];
    CHECK(tg_data(w, got, sizeof got) == TG_OK && got[5] == 5);
    uint8_t *changed = malloc(n);
    memcpy(changed, orig, n);
    float nv = 42;
    memcpy(changed + n - 16384 * 4 + 5 * 4, &nv, 4); /* element 5 of the only tensor */
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, changed, n, 0) == (ssize_t)n);
    if (fd >= 0) close(fd);
    CHECK(tg_data(w, got, sizeof got) == TG_OK && got[5] == 42 && got[6] == 6);
    free(changed);
    tg_state_dict_free(sd);
  }
  write_bytes(path, orig, n);
  /* a truncation under a live tensor: reading it raises SIGBUS (in a child; a handler shows it) */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = bus_exit;
    sigaction(SIGBUS, &sa, NULL);
    tg_state_dict *c = tg_safe_load_mmap(path);
    if (!c) _exit(2);
    if (truncate(path, 0) != 0) _exit(3);
    static float got[16384];
    tg_status st = tg_data(tg_state_dict_get(c, "w"), got, sizeof got);
    _exit(st == TG_OK ? 0 : 4);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK_MSG((WIFEXITED(status) && WEXITSTATUS(status) == 77) || (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS),
            "child status %#x", status);
  write_bytes(path, orig, n);
  free(orig);
  CHECK(tg_live_count() == 0);
}

/* A file name of 250 bytes (NAME_MAX is 255): its temporary file's name is cut to fit, the save
 * lands, nothing is left behind, and a save of the same name replaces it */
TEST(safe_save_long_file_name) {
  char name[251];
  memset(name, 'n', 250);
  memcpy(name + 250 - 12, ".safetensors", 12);
  name[250] = '\0';
  const char *path = tpath(name);
  for (int round = 0; round < 2; round++) {
    tg_state_dict *sd = small_dict((float)round);
    CHECK_MSG(tg_safe_save(sd, path) == TG_OK, "%s", take_error());
    tg_state_dict_free(sd);
    CHECK(holds_dict(path, (float)round));
    CHECK(temp_files_left() == 0);
  }
  unlink(path);
}

/* fp8 tensors as safetensors' F8_E4M3 / F8_E5M2 (tinygrad's safe_dtypes) and F8_E4M3FNUZ /
 * F8_E5M2FNUZ (the safetensors format's names): saved with that dtype name, read back bit for bit;
 * 1.0 is 0x38 in e4m3, 0x3c in e5m2 and 0x40 in both fnuz formats (their biases are one larger) */
TEST(safe_fp8_round_trip) {
  const tg_dtype dts[4] = {TG_FP8E4M3, TG_FP8E5M2, TG_FP8E4M3FNUZ, TG_FP8E5M2FNUZ};
  const char *names[4] = {"\"F8_E4M3\"", "\"F8_E5M2\"", "\"F8_E4M3FNUZ\"", "\"F8_E5M2FNUZ\""};
  const unsigned char one[4] = {0x38, 0x3c, 0x40, 0x40};
  for (int k = 0; k < 4; k++) {
    const float x[4] = {1.0f, -2.0f, 0.5f, 0.0f};
    tg_state_dict *sd = tg_state_dict_new();
    tg_scope_begin();
    tg_state_dict_set(sd, "a", tg_cast(tg_from_data(x, TG_SHAPE(4), NULL), dts[k]));
    tg_scope_end();
    const char *path = tpath("fp8.safetensors");
    CHECK_MSG(tg_safe_save(sd, path) == TG_OK, "%s", take_error());
    tg_state_dict_free(sd);
    size_t n = 0;
    char *raw = tt_read_file(path, &n);
    CHECK(raw && strstr(raw + 8, names[k]));
    free(raw);
    tg_state_dict *back = tg_safe_load(path);
    CHECK_MSG(back != NULL, "%s", take_error());
    if (!back) continue;
    tg_tensor a = tg_state_dict_get(back, "a");
    unsigned char bits[4] = {0};
    float f[4] = {0};
    CHECK(tg_dtype_of(a) == dts[k] && tg_data(a, bits, sizeof bits) == TG_OK && bits[0] == one[k]);
    tg_scope_begin();
    CHECK(tg_data(tg_cast(a, TG_FLOAT32), f, sizeof f) == TG_OK);
    tg_scope_end();
    for (int i = 0; i < 4; i++) CHECK_MSG(f[i] == x[i], "%s %d: %g", names[k], i, f[i]);
    tg_state_dict_free(back);
    unlink(path);
  }
}

int main(void) {
  int rc = RUN_TESTS();
  tmpdir_remove();
  if (tg_live_count() != 0) {
    fprintf(stderr, "%zu handles still live at exit\n", (size_t)tg_live_count());
    rc = 1;
  }
  return rc;
}
