/*
 * state_dict.c -- tg_state_dict: an ordered list of (name, tensor handle) plus ordered string
 * metadata, shared by every model-file loader and by tg_safe_save.
 *
 * In: names, tensors and strings from the user or a loader. Out: borrowed names and handles.
 * Invariants: each entry owns exactly one root-scope handle (freed by replace or by
 * tg_state_dict_free); names and metadata keys are unique NUL-free strings, found through an
 * open-addressing hash index so that loading a file with many entries stays linear; a dict from
 * tg_safe_load_mmap holds one reference to the file mapping, which every buffer that wraps it
 * shares: it is unmapped with the last of them, never under a tensor that still reads it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../helpers.h"
#include "../runtime/device.h"
#include "../tensor/tensor.h"
#include "../savefile.h"
#include "state_dict.h"

/* ---- a string -> index hash set (indices into a parallel array of strings) ---- */
typedef struct {
  int32_t *slots; /* -1 empty, else index */
  size_t cap;     /* power of two (0 = none) */
} Index;

/* Names come from untrusted files: the seed differs per process (address-space layout), so a file
 * cannot be crafted to make every name collide. */
static uint64_t str_hash(const char *s, size_t n) {
  static const char anchor = 0;
  return hash_bytes(s, n, 0x51ab1e ^ (uint64_t)(uintptr_t)&anchor);
}

static int index_find(const Index *ix, char *const *keys, const char *k, size_t n) {
  if (!ix->cap) return -1;
  size_t m = ix->cap - 1;
  for (size_t h = str_hash(k, n) & m;; h = (h + 1) & m) {
    int32_t i = ix->slots[h];
    if (i < 0) return -1;
    if (strlen(keys[i]) == n && memcmp(keys[i], k, n) == 0) return i;
  }
}

static void index_insert_raw(Index *ix, char *const *keys, int32_t i) {
  size_t m = ix->cap - 1;
  size_t h = str_hash(keys[i], strlen(keys[i])) & m;
  while (ix->slots[h] >= 0) h = (h + 1) & m;
  ix->slots[h] = i;
}

/* Called after keys[n-1] was appended: keeps the load factor under 1/2. */
static void index_add(Index *ix, char *const *keys, int n) {
  if ((size_t)n * 2 > ix->cap) {
    free(ix->slots);
    ix->cap = ix->cap ? ix->cap * 2 : 16;
    while ((size_t)n * 2 > ix->cap) ix->cap *= 2;
    ix->slots = tg_xmalloc(ix->cap * sizeof(int32_t));
    memset(ix->slots, 0xff, ix->cap * sizeof(int32_t));
    for (int i = 0; i < n; i++) index_insert_raw(ix, keys, i);
  } else {
    index_insert_raw(ix, keys, n - 1);
  }
}

struct tg_state_dict {
  char **names;
  tg_tensor *ts;
  int n, cap;
  Index ix;
  char **mkeys, **mvals;
  int mn, mcap;
  Index mix;
  FileMap *map; /* a reference to the file mapping (tg_safe_load_mmap) or NULL */
};

tg_state_dict *tg_state_dict_new(void) { return tg_xcalloc(1, sizeof(tg_state_dict)); }

/* Entries' handles are borrowed by users: tg_free refuses them, so the dict frees its own here. */
static void sd_release(tg_tensor t) {
  t_set_borrowed(t, false);
  tg_free(t);
}

static tg_tensor sd_adopt(tg_tensor t) {
  t = tg_persist(t);
  t_set_borrowed(t, true);
  return t;
}

void tg_state_dict_free(tg_state_dict *sd) {
  if (!sd) return;
  for (int i = 0; i < sd->n; i++) {
    sd_release(sd->ts[i]);
    free(sd->names[i]);
  }
  for (int i = 0; i < sd->mn; i++) {
    free(sd->mkeys[i]);
    free(sd->mvals[i]);
  }
  free(sd->names);
  free(sd->ts);
  free(sd->ix.slots);
  free(sd->mkeys);
  free(sd->mvals);
  free(sd->mix.slots);
  if (sd->map) file_map_unref(sd->map); /* unmapped here unless a buffer still wraps it */
  free(sd);
}

int tg_state_dict_len(const tg_state_dict *sd) { return sd ? sd->n : 0; }

const char *tg_state_dict_name(const tg_state_dict *sd, int i) {
  return sd && i >= 0 && i < sd->n ? sd->names[i] : NULL;
}

tg_tensor tg_state_dict_tensor(const tg_state_dict *sd, int i) {
  return sd && i >= 0 && i < sd->n ? sd->ts[i] : (tg_tensor){0};
}

int sd_find(const tg_state_dict *sd, const char *name, size_t len) {
  return index_find(&sd->ix, sd->names, name, len);
}

tg_tensor sd_get_quiet(const tg_state_dict *sd, const char *name) {
  if (!sd || !name) return (tg_tensor){0};
  int i = sd_find(sd, name, strlen(name));
  return i >= 0 ? sd->ts[i] : (tg_tensor){0};
}

bool tg_state_dict_has(const tg_state_dict *sd, const char *name) { return sd_get_quiet(sd, name).id != 0; }

/* Levenshtein distance of a[0..n) and b[0..m) with two rows (row: m + 1 entries of scratch). */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m, size_t *row) {
  for (size_t j = 0; j <= m; j++) row[j] = j;
  for (size_t i = 1; i <= n; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= m; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[m];
}

tg_tensor tg_state_dict_get(const tg_state_dict *sd, const char *name) {
  if (!sd) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_get: dict is NULL"), (tg_tensor){0};
  if (!name) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_get: name is NULL"), (tg_tensor){0};
  tg_tensor t = sd_get_quiet(sd, name);
  if (t.id) return t;
  if (sd->n == 0) {
    tg_set_error(TG_ERR_INVALID, "tg_state_dict_get: no tensor named '%.200s' (the dict is empty)", name);
    return t;
  }
  /* the closest name: typos and prefix mix-ups ("model." or not) are the usual causes. Names are
   * compared by their first 256 bytes, so a huge dict's error stays cheap. */
  size_t n = strlen(name), best = SIZE_MAX;
  int bi = 0;
  if (n > 256) n = 256;
  size_t row[257];
  for (int i = 0; i < sd->n; i++) {
    size_t m = strlen(sd->names[i]);
    if (m > 256) m = 256;
    size_t lo = m > n ? m - n : n - m; /* the distance is at least the length difference */
    if (lo >= best) continue;
    size_t d = edit_distance(name, n, sd->names[i], m, row);
    if (d < best) best = d, bi = i;
  }
  tg_set_error(TG_ERR_INVALID, "tg_state_dict_get: no tensor named '%.200s' (did you mean '%.200s'?)", name,
               sd->names[bi]);
  return t;
}

tg_status tg_state_dict_cast(tg_state_dict *sd, tg_dtype dtype) {
  if (!sd) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_cast: dict is NULL");
  if (!tg_dtype_is_float(dtype))
    return tg_set_error(TG_ERR_INVALID, "tg_state_dict_cast: %s is not a floating-point dtype",
                        tg_dtype_name(dtype) ? tg_dtype_name(dtype) : "(unknown)");
  for (int i = 0; i < sd->n; i++) {
    tg_dtype dt = tg_dtype_of(sd->ts[i]);
    if (!tg_dtype_is_float(dt) || dt == dtype) continue; /* indices and counters keep their dtype */
    tg_tensor c = tg_cast(sd->ts[i], dtype);
    if (!c.id) return tg_last_status() ? tg_last_status() : TG_ERR_INVALID;
    tg_status st = tg_realize(c); /* the old buffer goes now, not when the entry is first read */
    if (st != TG_OK) {
      tg_free(c);
      return st;
    }
    sd_release(sd->ts[i]);
    sd->ts[i] = sd_adopt(c);
  }
  return TG_OK;
}

static char *strndup_x(const char *s, size_t n) {
  char *r = tg_xmalloc(n + 1);
  memcpy(r, s, n);
  r[n] = 0;
  return r;
}

tg_status sd_put(tg_state_dict *sd, const char *fn, const char *path, const char *name, size_t len,
                 tg_tensor t, bool unique) {
  if (memchr(name, 0, len)) {
    tg_free(t);
    return tg_set_error(TG_ERR_IO, "%s: %s: tensor name contains a NUL byte", fn, path);
  }
  int i = sd_find(sd, name, len);
  if (i >= 0) {
    if (unique) {
      tg_free(t);
      return tg_set_error(TG_ERR_IO, "%s: %s: duplicate tensor name '%.200s'", fn, path, sd->names[i]);
    }
    sd_release(sd->ts[i]);
    sd->ts[i] = sd_adopt(t);
    return TG_OK;
  }
  if (sd->n == INT32_MAX / 2) {
    tg_free(t);
    return tg_set_error(TG_ERR_IO, "%s: %s: too many tensors", fn, path);
  }
  if (sd->n == sd->cap) {
    sd->cap = sd->cap ? sd->cap * 2 : 16;
    sd->names = tg_xrealloc(sd->names, (size_t)sd->cap * sizeof(char *));
    sd->ts = tg_xrealloc(sd->ts, (size_t)sd->cap * sizeof(tg_tensor));
  }
  sd->names[sd->n] = strndup_x(name, len);
  sd->ts[sd->n] = sd_adopt(t);
  sd->n++;
  index_add(&sd->ix, sd->names, sd->n);
  return TG_OK;
}

tg_status tg_state_dict_set(tg_state_dict *sd, const char *name, tg_tensor t) {
  if (!sd) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_set: dict is NULL");
  if (!name || !*name)
    return tg_set_error(TG_ERR_INVALID, "tg_state_dict_set: name is %s", name ? "empty" : "NULL");
  if (!tg_valid(t))
    return tg_set_error(TG_ERR_HANDLE, "tg_state_dict_set: tensor for '%.200s' is %s", name,
                        t.id ? "freed or stale" : "none (an earlier call failed?)");
  /* a second handle of the very same UOp (not tg_detach, which adds a DETACH node): a realized
   * tensor stays realized, and the entry does not depend on the caller's handle or scope */
  UOp *u = t_get(t, "tg_state_dict_set");
  if (!u) return TG_ERR_HANDLE;
  tg_tensor own = t_wrap(uop_ref(u));
  if (!own.id) return tg_last_status() ? tg_last_status() : TG_ERR_HANDLE;
  /* the entry is a second handle of a tensor someone else holds: marked requires_grad false, so
   * tg_backward does not pile a gradient onto it every step (the owner's handle gets it) */
  t_slot(own)->requires_grad = 0;
  return sd_put(sd, "tg_state_dict_set", "(dict)", name, strlen(name), own, false);
}

tg_status sd_meta_put(tg_state_dict *sd, const char *fn, const char *path, const char *key, size_t klen,
                      const char *value, size_t vlen, bool unique) {
  if (memchr(key, 0, klen))
    return tg_set_error(TG_ERR_IO, "%s: %s: metadata key contains a NUL byte", fn, path);
  int i = index_find(&sd->mix, sd->mkeys, key, klen);
  if (i >= 0) {
    if (unique)
      return tg_set_error(TG_ERR_IO, "%s: %s: duplicate metadata key '%.200s'", fn, path, sd->mkeys[i]);
    /* copy first: value may be the old string itself (meta_set(sd, k, meta_get(sd, k))) */
    char *v = strndup_x(value, vlen);
    free(sd->mvals[i]);
    sd->mvals[i] = v;
    return TG_OK;
  }
  if (sd->mn == INT32_MAX / 2) return tg_set_error(TG_ERR_IO, "%s: %s: too many metadata keys", fn, path);
  if (sd->mn == sd->mcap) {
    sd->mcap = sd->mcap ? sd->mcap * 2 : 16;
    sd->mkeys = tg_xrealloc(sd->mkeys, (size_t)sd->mcap * sizeof(char *));
    sd->mvals = tg_xrealloc(sd->mvals, (size_t)sd->mcap * sizeof(char *));
  }
  sd->mkeys[sd->mn] = strndup_x(key, klen);
  sd->mvals[sd->mn] = strndup_x(value, vlen);
  sd->mn++;
  index_add(&sd->mix, sd->mkeys, sd->mn);
  return TG_OK;
}

tg_status tg_state_dict_meta_set(tg_state_dict *sd, const char *key, const char *value) {
  if (!sd) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_meta_set: dict is NULL");
  if (!key || !*key)
    return tg_set_error(TG_ERR_INVALID, "tg_state_dict_meta_set: key is %s", key ? "empty" : "NULL");
  if (!value) return tg_set_error(TG_ERR_INVALID, "tg_state_dict_meta_set: value for '%.200s' is NULL", key);
  return sd_meta_put(sd, "tg_state_dict_meta_set", "(dict)", key, strlen(key), value, strlen(value), false);
}

const char *tg_state_dict_meta_get(const tg_state_dict *sd, const char *key) {
  if (!sd || !key) return NULL;
  int i = index_find(&sd->mix, sd->mkeys, key, strlen(key));
  return i >= 0 ? sd->mvals[i] : NULL;
}

int tg_state_dict_meta_len(const tg_state_dict *sd) { return sd ? sd->mn : 0; }
const char *tg_state_dict_meta_key(const tg_state_dict *sd, int i) {
  return sd && i >= 0 && i < sd->mn ? sd->mkeys[i] : NULL;
}
const char *tg_state_dict_meta_value(const tg_state_dict *sd, int i) {
  return sd && i >= 0 && i < sd->mn ? sd->mvals[i] : NULL;
}

/* ---- shared file mappings ---- */

struct FileMap {
  void *addr;
  size_t len;
  int refcount; /* atomic: buffers are released on whichever thread drops them */
};

FileMap *file_map_new(void *addr, size_t len) {
  FileMap *m = tg_xmalloc(sizeof *m);
  m->addr = addr;
  m->len = len;
  m->refcount = 1;
  return m;
}

void file_map_unref(void *p) {
  FileMap *m = p;
  int left = __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL);
  TG_ASSERT(left >= 0);
  if (left) return;
  munmap(m->addr, m->len);
  free(m);
}

void file_map_attach(FileMap *m, tg_tensor t) {
  UOp *u = t_get(t, "file_map_attach");
  Buffer *b = u ? g_buffer_of(u) : NULL;
  TG_ASSERT(b && b->external);
  __atomic_fetch_add(&m->refcount, 1, __ATOMIC_RELAXED);
  buffer_on_free(b, file_map_unref, m);
}

void sd_own_mapping(tg_state_dict *sd, FileMap *m) {
  TG_ASSERT(!sd->map);
  sd->map = m;
}

/* ---- files ---- */


int open_regular(const char *fn, const char *path, struct stat *st) {
  /* O_NONBLOCK: opening a FIFO that has no writer must not wait for one (it is refused below) */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return tg_set_error(TG_ERR_IO, "%s: %s: cannot open: %s", fn, path, strerror(errno)), -1;
  if (fstat(fd, st) != 0) {
    int e = errno;
    close(fd);
    return tg_set_error(TG_ERR_IO, "%s: %s: cannot stat: %s", fn, path, strerror(e)), -1;
  }
  if (S_ISDIR(st->st_mode)) {
    close(fd);
    return tg_set_error(TG_ERR_IO, "%s: %s: is a directory", fn, path), -1;
  }
  if (!S_ISREG(st->st_mode)) { /* a device or a pipe could be endless: never read one */
    close(fd);
    return tg_set_error(TG_ERR_IO, "%s: %s is not a regular file (%s); copy the data to a file and load that",
                        fn, path, file_kind(st->st_mode)),
           -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

void (*io_test_hook)(const char *path, int stage);

/* the memory of this thread's file_view_open, for sd_release_bytes */
static _Thread_local const uint8_t *rel_lo, *rel_hi;

void sd_release_bytes(const uint8_t *p, size_t n) {
  if (!p || !rel_lo || p < rel_lo || n > (size_t)(rel_hi - p)) return;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + n) / page * page;
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* reads as zeros afterwards */
}

/* pread until n bytes are in or the file ends: the count, or -1 with errno. */
static int64_t pread_full(int fd, uint8_t *dst, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    size_t want = n - got > (1u << 30) ? (1u << 30) : n - got;
    ssize_t k = pread(fd, dst + got, want, (off_t)(off + got));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    if (k == 0) break;
    got += (size_t)k;
  }
  return (int64_t)got;
}

tg_status src_open(Src *s, const char *fn, const char *path) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  s->fn = fn;
  s->path = path;
  if (!path) return tg_set_error(TG_ERR_INVALID, "%s: path is NULL", fn);
  struct stat st;
  s->fd = open_regular(fn, path, &st);
  if (s->fd < 0) return tg_last_status();
  s->len = (uint64_t)st.st_size;
  if (io_test_hook) io_test_hook(path, 0);
  return TG_OK;
}

void src_close(Src *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

tg_status src_read(const Src *s, uint64_t off, void *dst, size_t n) {
  if (s->fd < 0) {
    memcpy(dst, s->mem + off, n);
    return TG_OK;
  }
  int64_t got = pread_full(s->fd, dst, n, off);
  if (got < 0) return tg_set_error(TG_ERR_IO, "%s: %s: cannot read: %s", s->fn, s->path, strerror(errno));
  if ((size_t)got < n) {
    struct stat st;
    uint64_t now = fstat(s->fd, &st) == 0 ? (uint64_t)st.st_size : off + (uint64_t)got;
    return tg_set_error(TG_ERR_IO,
                        "%s: %s: the file shrank from %llu to %llu bytes while it was read (truncated or "
                        "rewritten by another process?)",
                        s->fn, s->path, (unsigned long long)s->len, (unsigned long long)now);
  }
  return TG_OK;
}

tg_status file_view_open(FileView *fv, const char *fn, const char *path, bool map) {
  memset(fv, 0, sizeof *fv);
  if (!path) return tg_set_error(TG_ERR_INVALID, "%s: path is NULL", fn);
  if (!map) { /* read, never mapped: see state_dict.h */
    Src s;
    if (src_open(&s, fn, path) != TG_OK) return tg_last_status();
    tg_status st = TG_OK;
    if (s.len > (uint64_t)SIZE_MAX / 2) {
      st = tg_set_error(TG_ERR_IO, "%s: %s: file too large to read (%llu bytes)", fn, path,
                        (unsigned long long)s.len);
    } else if (s.len > 0) {
      /* anonymous pages, so that sd_release_bytes can give back what the loader is done with */
      size_t n = (size_t)s.len;
      void *buf = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (buf == MAP_FAILED)
        st = tg_set_error(TG_ERR_IO, "%s: %s: out of memory reading %zu bytes", fn, path, n);
      else if ((st = src_read(&s, 0, buf, n)) != TG_OK)
        munmap(buf, n);
      else {
        uint8_t extra;
        if (pread_full(s.fd, &extra, 1, s.len) > 0) { /* it grew: what was read may be a mix */
          munmap(buf, n);
          st = tg_set_error(TG_ERR_IO, "%s: %s: the file grew while it was read (rewritten by another process?)",
                            fn, path);
        } else {
          fv->data = fv->owned = buf;
          fv->len = fv->owned_len = n;
          rel_lo = buf;
          rel_hi = (const uint8_t *)buf + n;
        }
      }
    }
    src_close(&s);
    return st;
  }
  struct stat st;
  int fd = open_regular(fn, path, &st);
  if (fd < 0) return tg_last_status();
  if (st.st_size > 0) {
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
      close(fd);
      return tg_set_error(TG_ERR_IO, "%s: %s: file too large to map", fn, path);
    }
    size_t n = (size_t)st.st_size;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      return tg_set_error(TG_ERR_IO, "%s: %s: cannot map %zu bytes: %s", fn, path, n, strerror(e));
    }
    fv->data = m;
    fv->len = n;
    fv->map = m;
    fv->map_len = n;
  }
  close(fd);
  return TG_OK;
}

void file_view_close(FileView *fv) {
  if (fv->map) munmap(fv->map, fv->map_len);
  if (fv->owned) {
    munmap(fv->owned, fv->owned_len);
    rel_lo = rel_hi = NULL;
  }
  memset(fv, 0, sizeof *fv);
}

bool utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t k;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
      k = 1, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
      k = 2, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
      k = 3, cp = c & 0x07, min = 0x10000;
    else
      return false;
    if (n - i <= k) return false;
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + j] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += k + 1;
  }
  return true;
}
