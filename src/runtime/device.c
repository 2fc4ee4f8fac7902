/*
 * device.c -- the device registry, device buffers with a caching allocator, and the in-memory
 * program cache. Everything device-specific goes through a DeviceVT.
 *
 * In: device strings ("CPU", "cpu:1", NULL = DEV), buffer sizes, kernel sources.
 * Out: Device*, Buffer*, Program* that stay valid as documented in device.h.
 * Invariants:
 *  - A Device is opened at most once per (kind, index) and is never closed: its table only grows,
 *    and device_by_id/device_get read it without locking.
 *  - A small block on a device's free list, or a free chunk of a large-block segment, is not
 *    referenced by any Buffer; the sum of their sizes is Device.cached_bytes. The small blocks
 *    never exceed CACHE_CAP after a free returns; chunks of one segment tile it in address order
 *    and no two free chunks are neighbours.
 *  - A Program is created once per (device, fname, source) and lives for the process; it stays
 *    reachable from the program table, so leak checkers see no leak.
 */
#include "device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* registry                                                                                        */

typedef struct {
  const char *name;
  const DeviceVT *vt;
  /* Buffers are plain host pointers in this process: copies need no staging buffer, a program
   * loaded for one instance can run on every instance of the kind, and large blocks may be carved
   * out of bigger allocations (pointer arithmetic on Buffer.ptr). */
  bool host_memory;
  const char *const *renderers; /* default first; NULL-terminated */
  const DeviceVT *const *rvts;  /* per renderer, its device (NULL: vt) */
  /* An ARCH may follow the kind or its number without the renderer ("CUDA:sm_80", "CUDA:1:sm_80"
   * for CUDA:1:CUDA:sm_80): the kind has one renderer, and its archs are not renderer names. */
  bool arch_shorthand;
} DeviceKind;

static const char *const CPU_RENDERERS[] = {"C", "LLVM", NULL};
static const DeviceVT *const CPU_RVTS[] = {&cpu_device_vt, &llvm_device_vt, NULL};
static const char *const CL_RENDERERS[] = {"OpenCL", NULL};
static const char *const NULL_RENDERERS[] = {"CUDA", NULL};
static const char *const CUDA_RENDERERS[] = {"CUDA", NULL};

/* NV is tinygrad's other name for an NVIDIA GPU: here the same device as CUDA (the driver API), kept
 * under the name it was asked by. NV:0 and CUDA:0 share the GPU's primary context, so their buffers
 * copy to each other on the GPU. */
static const DeviceKind g_kinds[] = {
    {"CPU", &cpu_device_vt, true, CPU_RENDERERS, CPU_RVTS, false},
    {"CL", &cl_device_vt, false, CL_RENDERERS, NULL, false},
    {"NULL", &nullcuda_device_vt, false, NULL_RENDERERS, NULL, false},
    {"CUDA", &cuda_device_vt, false, CUDA_RENDERERS, NULL, true},
    {"NV", &cuda_device_vt, false, CUDA_RENDERERS, NULL, true},
};
#define NKINDS (sizeof g_kinds / sizeof g_kinds[0])

int device_kind_count(void) { return (int)NKINDS; }
const char *device_kind_name(int i) { return i >= 0 && i < (int)NKINDS ? g_kinds[i].name : NULL; }
const char *const *device_kind_renderers(int i) { return i >= 0 && i < (int)NKINDS ? g_kinds[i].renderers : NULL; }

typedef struct Segment Segment;
/* Bucket of the caching allocator: every cached block of exactly `nbytes` (0 = empty slot). */
struct FreeBlock {
  size_t nbytes;
  void **ptrs;
  size_t n, cap;
  uint64_t used; /* the allocator's clock at this size's last put or take (eviction order) */
};

typedef struct {
  Device pub; /* first: a Device* is a DeviceImpl* */
  const DeviceKind *kind;
  pthread_mutex_t lock; /* guards pub.free_list, pub.cached_bytes, nbuckets, nused */
  size_t nbuckets;      /* power of two (or 0): capacity of the open-addressing table free_list */
  size_t nused;
  Segment *segs;        /* large-block segments */
  size_t small_cached;  /* the part of pub.cached_bytes in small blocks (the bucket table) */
  size_t live_bytes;    /* block bytes held by buffers */
  size_t high_water;    /* the most live_bytes + cached_bytes has been */
  size_t peak_live;     /* the most live_bytes has been */
  uint64_t clock;       /* counts small-block puts and takes */
} DeviceImpl;

static pthread_mutex_t g_dev_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(Device **) g_devs;
static _Atomic int g_ndevs;
static int g_devcap;
/* Superseded copies of the table: a lock-free reader may still be looking at one. */
static Device ***g_old_tables;
static size_t g_nold;

static const DeviceKind *kind_of(const Device *d) { return ((const DeviceImpl *)d)->kind; }

/* The device of a renderer of kind k (its own vtable where the kind has one per renderer). */
static const DeviceVT *renderer_vt(const DeviceKind *k, const char *renderer) {
  for (int i = 0; k->rvts && k->renderers[i]; i++)
    if (k->renderers[i] == renderer && k->rvts[i]) return k->rvts[i];
  return k->vt;
}

static Device *find_open(const DeviceKind *k, int index, const char *renderer, const char *arch) {
  int n = atomic_load_explicit(&g_ndevs, memory_order_acquire);
  Device **t = atomic_load_explicit(&g_devs, memory_order_acquire);
  const DeviceVT *vt = renderer_vt(k, renderer);
  for (int i = 0; i < n; i++)
    if (kind_of(t[i]) == k && t[i]->index == index && t[i]->vt == vt && strcmp(t[i]->arch, arch) == 0) return t[i];
  return NULL;
}

static void unknown_device(const char *name, const char *part) {
  SB avail;
  sb_init(&avail);
  for (size_t i = 0; i < NKINDS; i++) {
    sb_printf(&avail, "%s%s[:<n>][:", i ? ", " : "", g_kinds[i].name);
    for (const char *const *r = g_kinds[i].renderers; *r; r++) sb_printf(&avail, "%s%s", r == g_kinds[i].renderers ? "" : "|", *r);
    sb_puts(&avail, "]");
  }
  tg_set_error(TG_ERR_INVALID, "device_get: unknown device '%s'%s (available: %s)", name, part, avail.s);
  sb_free(&avail);
}

/* DEVICE[:N][:RENDERER[:ARCH]], case-insensitive; the instance number may also come last
 * ("CL:OpenCL:1"). ARCH is the rest of the string after the renderer (it may hold commas:
 * "CPU:LLVM:x86_64,znver2,avx2,-avx512f"); only a renderer whose device has open_arch takes one
 * (its open checks it). */
static bool parse_device(const char *name, const DeviceKind **kind, int *index, const char **renderer, char *arch,
                         size_t archcap) {
  arch[0] = '\0';
  const char *colon = strchr(name, ':');
  size_t klen = colon ? (size_t)(colon - name) : strlen(name);
  *kind = NULL;
  *renderer = NULL;
  for (size_t i = 0; i < NKINDS; i++)
    if (strlen(g_kinds[i].name) == klen && strncasecmp(g_kinds[i].name, name, klen) == 0) *kind = &g_kinds[i];
  if (!*kind) {
    unknown_device(name, "");
    return false;
  }
  *index = 0;
  *renderer = (*kind)->renderers[0];
  bool have_index = false, have_renderer = false;
  for (const char *p = colon; p;) {
    const char *tok = p + 1, *end = strchr(tok, ':');
    size_t n = end ? (size_t)(end - tok) : strlen(tok);
    p = end;
    if (n == 0) {
      unknown_device(name, ": empty part");
      return false;
    }
    size_t nd = 1;
    while (nd < n && tok[nd] >= '0' && tok[nd] <= '9') nd++;
    if (tok[0] == '-' && n > 1 && nd == n) { /* "CPU:-1": an instance number, not a renderer's name */
      unknown_device(name, ": instance numbers count from 0 (no negative ones)");
      return false;
    }
    if (tok[0] >= '0' && tok[0] <= '9') {
      int64_t v = 0;
      for (size_t i = 0; i < n; i++) {
        if (tok[i] < '0' || tok[i] > '9' || (v = v * 10 + (tok[i] - '0')) > 1000000) {
          unknown_device(name, ": bad instance number");
          return false;
        }
      }
      if (have_index) {
        unknown_device(name, ": two instance numbers");
        return false;
      }
      *index = (int)v;
      have_index = true;
      continue;
    }
    if (!have_renderer) {
      const char *const *r = (*kind)->renderers;
      while (*r && !(strlen(*r) == n && strncasecmp(*r, tok, n) == 0)) r++;
      if (!*r && (*kind)->arch_shorthand) {
        if (strlen(tok) >= archcap) {
          unknown_device(name, ": arch string too long");
          return false;
        }
        snprintf(arch, archcap, "%s", tok); /* the default renderer's open checks it */
        return true;
      }
      if (!*r) {
        SB m;
        sb_init(&m);
        sb_printf(&m, ": %s has no renderer '%.*s' (renderers: ", (*kind)->name, (int)n, tok);
        for (r = (*kind)->renderers; *r; r++) sb_printf(&m, "%s%s", r == (*kind)->renderers ? "" : ", ", *r);
        sb_puts(&m, ")");
        unknown_device(name, m.s);
        sb_free(&m);
        return false;
      }
      *renderer = *r;
      have_renderer = true;
      continue;
    }
    if (renderer_vt(*kind, *renderer)->open_arch) {
      /* everything after the renderer is its arch */
      if (strlen(tok) >= archcap) {
        unknown_device(name, ": arch string too long");
        return false;
      }
      snprintf(arch, archcap, "%s", tok);
      return true;
    }
    SB m;
    sb_init(&m);
    sb_printf(&m, ": renderer %s has no arch '%.*s' (it targets the device it runs on; archs: none)", *renderer, (int)n, tok);
    unknown_device(name, m.s);
    sb_free(&m);
    return false;
  }
  return true;
}

static Device *open_device(const DeviceKind *k, int index, const char *renderer, const char *arch) {
  pthread_mutex_lock(&g_dev_lock);
  Device *d = find_open(k, index, renderer, arch);
  if (d) {
    pthread_mutex_unlock(&g_dev_lock);
    return d;
  }
  bool had_error = tg_has_error();
  const DeviceVT *vt = renderer_vt(k, renderer);
  void *state = vt->open_arch ? vt->open_arch(index, arch[0] ? arch : NULL) : vt->open(index);
  if (!state) {
    pthread_mutex_unlock(&g_dev_lock);
    /* the runtime's own reason first (a missing library, no such device) */
    if (!had_error && tg_has_error()) {
      error_restate(TG_ERR_RUNTIME, NULL, "device_get: cannot open %s:%d%s%s", k->name, index, vt != k->vt ? ":" : "",
                    vt != k->vt ? renderer : "");
    } else {
      tg_set_error(TG_ERR_RUNTIME, "device_get: cannot open %s:%d", k->name, index);
    }
    return NULL;
  }
  DeviceImpl *di = tg_xcalloc(1, sizeof *di);
  di->kind = k;
  pthread_mutex_init(&di->lock, NULL);
  d = &di->pub;
  d->vt = vt;
  d->state = state;
  d->index = index;
  d->renderer = renderer;
  snprintf(d->arch, sizeof d->arch, "%s", arch);
  d->caps.max_dims = 1;
  if (vt->caps) vt->caps(state, &d->caps);
  int o = index == 0 ? snprintf(d->name, sizeof d->name, "%s", k->name) : snprintf(d->name, sizeof d->name, "%s:%d", k->name, index);
  if ((vt != k->vt || arch[0]) && o > 0 && (size_t)o < sizeof d->name)
    snprintf(d->name + o, sizeof d->name - (size_t)o, ":%s%s%s", renderer, arch[0] ? ":" : "", arch);
  int n = atomic_load(&g_ndevs);
  Device **t = atomic_load(&g_devs);
  if (n == g_devcap) {
    int cap = g_devcap ? g_devcap * 2 : 4;
    Device **nt = tg_xcalloc((size_t)cap, sizeof *nt);
    if (n) memcpy(nt, t, (size_t)n * sizeof *nt);
    if (t) {
      g_old_tables = tg_xrealloc(g_old_tables, (g_nold + 1) * sizeof *g_old_tables);
      g_old_tables[g_nold++] = t;
    }
    t = nt;
    g_devcap = cap;
    atomic_store_explicit(&g_devs, t, memory_order_release);
  }
  d->id = n;
  t[n] = d;
  atomic_store_explicit(&g_ndevs, n + 1, memory_order_release);
  pthread_mutex_unlock(&g_dev_lock);
  if (debug_level() >= 1) {
    if (n == 0) device_list_print();
    fprintf(stderr, "opened device %s from pid:%d\n", d->name, (int)getpid());
    if (vt->describe) vt->describe(state);
    if (!d->caps.gpu && d->caps.vec_bytes)
      fprintf(stderr, "  %d-byte vectors x %d registers; data caches L1 %lld KiB, L2 %lld KiB, L3 %lld KiB (0: unknown)\n",
              d->caps.vec_bytes, d->caps.vec_regs, (long long)(d->caps.l1d_bytes >> 10), (long long)(d->caps.l2_bytes >> 10),
              (long long)(d->caps.l3_bytes >> 10));
  }
  return d;
}

/* Does p (after spaces and an opening parenthesis) start with a device kind's name, ending there? */
static bool starts_kind(const char *p) {
  while (*p == ' ' || *p == '(') p++;
  if (!*p || *p == ')') return true; /* nothing follows: a trailing comma */
  for (size_t i = 0; i < NKINDS; i++) {
    size_t n = strlen(g_kinds[i].name);
    if (strncasecmp(p, g_kinds[i].name, n) == 0 && strchr(":, )", p[n])) return true;
  }
  return false;
}

const char *device_tuple_sep(const char *p) {
  for (const char *e = strchr(p, ','); e; e = strchr(e + 1, ','))
    if (starts_kind(e + 1)) return e;
  return NULL;
}

Device *device_get(const char *name) {
  /* NULL is the default device; an empty name is an error (an unset setting passed along), as
   * tinygrad refuses "" rather than reading it as the default */
  if (name && !*name) {
    tg_set_error(TG_ERR_INVALID, "device_get: the device name \"\" is empty (give one such as \"CPU:1\", or NULL "
                                 "for the default device)");
    return NULL;
  }
  if (!name) name = getenv_str("DEV", "CPU");
  if (!name || !*name) name = "CPU";
  if (device_tuple_sep(name)) return device_tuple_get(name);
  const DeviceKind *k;
  int index;
  const char *renderer;
  char arch[128];
  if (!parse_device(name, &k, &index, &renderer, arch, sizeof arch)) return NULL;
  Device *d = find_open(k, index, renderer, arch);
  return d ? d : open_device(k, index, renderer, arch);
}

Device *device_default(void) { return device_get(NULL); }

Device *device_by_id(int id) {
  if (device_is_tuple(id)) return device_tuple_by_id(id);
  int n = atomic_load_explicit(&g_ndevs, memory_order_acquire);
  if (id < 0 || id >= n) return NULL;
  return atomic_load_explicit(&g_devs, memory_order_acquire)[id];
}

void device_list_print(void) {
  fprintf(stderr, "device kinds:");
  for (size_t i = 0; i < NKINDS; i++) fprintf(stderr, " %s (%s:<n>, renderer %s)", g_kinds[i].name, g_kinds[i].name, g_kinds[i].renderers[0]);
  fprintf(stderr, "\nopened devices:");
  int n = atomic_load_explicit(&g_ndevs, memory_order_acquire);
  Device **t = atomic_load_explicit(&g_devs, memory_order_acquire);
  for (int i = 0; i < n; i++) fprintf(stderr, " %s", t[i]->name);
  fprintf(stderr, "%s\n", n ? "" : " (none)");
}

/* ---------------------------------------------------------------------------------------------- */
/* caching allocator                                                                               */

/* Small blocks (under LARGE_MIN) are cached by exact size. Past CACHE_CAP idle bytes of them, the
 * sizes used longest ago are returned to the device until half the cap is left: the sizes a loop
 * uses every step stay, one-off sizes (a batch of each length) go. (The whole cache used to be
 * dropped at 1 GiB: a loop over varying sizes held about 1 GiB it never used again.) A device whose
 * memory is not the host's caches all its blocks by exact size (device handles have no addresses to
 * carve), and returns idle ones, the sizes used longest ago first, only when a request the cache
 * cannot serve would take the device's footprint (live + idle) past twice the most its buffers have
 * held at once: a phase of the program whose buffers cannot be carved out of another phase's keeps
 * them too. (A fixed cap returned a training step's activations, and the high-water mark alone an
 * evaluation's 737 MB convolution output, which the next evaluation could not reuse; PoCL mapped and
 * faulted them in afresh every time: a quarter of beautiful_mnist's CL step, half of its
 * evaluation.) */
#define CACHE_CAP ((size_t)256 << 20)
#define BLOCK_ALIGN ((size_t)64)

/* Large blocks are carved out of segments the device allocated: a request takes a free chunk of
 * exactly its size, else the smallest larger one (split, the rest stays free), and a freed chunk
 * merges with its free neighbours. So one phase of a program reuses another phase's memory even when
 * their sizes differ (an evaluation of the whole test set after training steps on batches: the
 * steps' activations are carved out of the evaluation's big buffers and the evaluation finds them
 * whole again). A request nothing free can hold maps a new segment; if that would take the
 * device's footprint (live + idle bytes) past its high-water mark, wholly free segments are
 * returned to the device first, so idle memory never raises the peak. */
#define LARGE_MIN ((size_t)1 << 20)
#define CHUNK_ALIGN ((size_t)4096)

typedef struct Chunk {
  char *ptr;
  size_t size;
  bool used;
  struct Chunk *prev, *next; /* neighbours in address order within the segment */
} Chunk;

struct Segment {
  void *base;
  size_t size;
  Chunk *first;
  Segment *prev, *next;
};

static _Atomic size_t g_live_buffers;
void (*buffer_mem_hook)(const Device *dev, int64_t delta);
static _Atomic uint64_t g_mem_used;

static inline size_t bucket_index(size_t nbytes, size_t mask) {
  return (size_t)hash_mix(0, (uint64_t)nbytes) & mask;
}

static struct FreeBlock *bucket_find(DeviceImpl *d, size_t nbytes) {
  if (!d->nbuckets) return NULL;
  size_t mask = d->nbuckets - 1;
  for (size_t i = bucket_index(nbytes, mask);; i = (i + 1) & mask) {
    struct FreeBlock *b = &d->pub.free_list[i];
    if (b->nbytes == nbytes) return b;
    if (b->nbytes == 0) return NULL;
  }
}

static struct FreeBlock *bucket_insert(DeviceImpl *d, size_t nbytes) {
  if ((d->nused + 1) * 2 > d->nbuckets) {
    size_t ncap = d->nbuckets ? d->nbuckets * 2 : 16;
    struct FreeBlock *old = d->pub.free_list;
    size_t oldcap = d->nbuckets;
    d->pub.free_list = tg_xcalloc(ncap, sizeof(struct FreeBlock));
    d->nbuckets = ncap;
    for (size_t i = 0; i < oldcap; i++) {
      if (!old[i].nbytes) continue;
      size_t mask = ncap - 1, j = bucket_index(old[i].nbytes, mask);
      while (d->pub.free_list[j].nbytes) j = (j + 1) & mask;
      d->pub.free_list[j] = old[i];
    }
    free(old);
  }
  size_t mask = d->nbuckets - 1, i = bucket_index(nbytes, mask);
  while (d->pub.free_list[i].nbytes) i = (i + 1) & mask;
  d->pub.free_list[i].nbytes = nbytes;
  d->nused++;
  return &d->pub.free_list[i];
}

/* Returns every wholly free segment to the device until `need` bytes are freed. Caller holds d->lock. */
static void segments_release_locked(DeviceImpl *d, size_t need) {
  size_t freed = 0;
  for (Segment *g = d->segs, *nx; g && freed < need; g = nx) {
    nx = g->next;
    if (g->first->used || g->first->next) continue;
    d->pub.vt->free(d->pub.state, g->base, g->size);
    d->pub.cached_bytes -= g->size;
    freed += g->size;
    if (g->prev) g->prev->next = g->next;
    else d->segs = g->next;
    if (g->next) g->next->prev = g->prev;
    free(g->first);
    free(g);
  }
}

/* Frees every cached small block and the bucket table. Caller holds d->lock. */
static void small_cache_drop_locked(DeviceImpl *d) {
  for (size_t i = 0; i < d->nbuckets; i++) {
    struct FreeBlock *b = &d->pub.free_list[i];
    for (size_t j = 0; j < b->n; j++) d->pub.vt->free(d->pub.state, b->ptrs[j], b->nbytes);
    free(b->ptrs);
  }
  free(d->pub.free_list);
  d->pub.free_list = NULL;
  d->nbuckets = d->nused = 0;
  d->pub.cached_bytes -= d->small_cached;
  d->small_cached = 0;
}

static int by_used(const void *a, const void *b) {
  uint64_t x = (*(struct FreeBlock *const *)a)->used, y = (*(struct FreeBlock *const *)b)->used;
  return x < y ? -1 : x > y;
}

/* Returns the cached small blocks of the sizes used longest ago to the device until at most keep
 * idle bytes are left, and rebuilds the size table without the sizes that hold nothing. Caller
 * holds d->lock. */
static void small_cache_evict_locked(DeviceImpl *d, size_t keep) {
  struct FreeBlock **order = tg_xmalloc(sizeof *order * (d->nbuckets + 1));
  size_t n = 0;
  for (size_t i = 0; i < d->nbuckets; i++)
    if (d->pub.free_list[i].nbytes) order[n++] = &d->pub.free_list[i];
  qsort(order, n, sizeof *order, by_used);
  for (size_t i = 0; i < n && d->small_cached > keep; i++) {
    struct FreeBlock *b = order[i];
    for (size_t j = 0; j < b->n; j++) d->pub.vt->free(d->pub.state, b->ptrs[j], b->nbytes);
    d->pub.cached_bytes -= b->n * b->nbytes;
    d->small_cached -= b->n * b->nbytes;
    b->n = 0;
  }
  free(order);
  /* the table keeps only sizes with blocks (the open addressing has no deletion: rebuild it) */
  struct FreeBlock *old = d->pub.free_list;
  size_t oldcap = d->nbuckets;
  d->pub.free_list = NULL;
  d->nbuckets = d->nused = 0;
  for (size_t i = 0; i < oldcap; i++) {
    if (!old[i].nbytes) continue;
    if (!old[i].n) {
      free(old[i].ptrs);
      continue;
    }
    struct FreeBlock *b = bucket_insert(d, old[i].nbytes);
    *b = old[i];
  }
  free(old);
}

/* Frees every cached small block and every wholly free segment. Caller holds d->lock. */
static void cache_drop_locked(DeviceImpl *d) {
  small_cache_drop_locked(d);
  segments_release_locked(d, SIZE_MAX);
}

/* Buffers now hold nbytes more that the device had to map: raises the high-water mark if the
 * footprint grew past it. Caller holds d->lock. */
static void grow_locked(DeviceImpl *d, size_t nbytes) {
  d->live_bytes += nbytes;
  if (d->live_bytes > d->peak_live) d->peak_live = d->live_bytes;
  if (d->live_bytes + d->pub.cached_bytes > d->high_water) d->high_water = d->live_bytes + d->pub.cached_bytes;
}

void device_cache_clear(Device *dev) {
  DeviceImpl *d = (DeviceImpl *)dev;
  pthread_mutex_lock(&d->lock);
  cache_drop_locked(d);
  pthread_mutex_unlock(&d->lock);
}

/* A free chunk of exactly nbytes, else the smallest larger one split to nbytes; NULL if none.
 * Caller holds d->lock. */
static Chunk *chunk_take_locked(DeviceImpl *d, size_t nbytes) {
  Chunk *best = NULL;
  for (Segment *g = d->segs; g; g = g->next)
    for (Chunk *c = g->first; c; c = c->next) {
      if (c->used || c->size < nbytes || (best && c->size >= best->size)) continue;
      best = c;
      if (c->size == nbytes) goto found;
    }
  if (!best) return NULL;
found:
  if (best->size > nbytes) {
    Chunk *rest = tg_xmalloc(sizeof *rest);
    *rest = (Chunk){best->ptr + nbytes, best->size - nbytes, false, best, best->next};
    if (best->next) best->next->prev = rest;
    best->next = rest;
    best->size = nbytes;
  }
  best->used = true;
  d->pub.cached_bytes -= nbytes;
  d->live_bytes += nbytes;
  return best;
}

/* Merges c's next chunk (free, like c) into c. */
static void chunk_absorb_next(Chunk *c) {
  Chunk *n = c->next;
  c->size += n->size;
  c->next = n->next;
  if (n->next) n->next->prev = c;
  free(n);
}

/* Marks c free and merges it with free neighbours. Caller holds d->lock. */
static void chunk_put_locked(DeviceImpl *d, Chunk *c) {
  c->used = false;
  d->pub.cached_bytes += c->size;
  if (c->next && !c->next->used) chunk_absorb_next(c);
  if (c->prev && !c->prev->used) chunk_absorb_next(c->prev);
}

/* A new segment of nbytes holding one used chunk (the lock is not held while the device maps it). */
static Chunk *segment_new(DeviceImpl *d, size_t nbytes) {
  void *p = d->pub.vt->alloc(d->pub.state, nbytes);
  if (!p) return NULL;
  Segment *g = tg_xcalloc(1, sizeof *g);
  Chunk *c = tg_xmalloc(sizeof *c);
  *c = (Chunk){p, nbytes, true, NULL, NULL};
  g->base = p;
  g->size = nbytes;
  g->first = c;
  pthread_mutex_lock(&d->lock);
  g->next = d->segs;
  if (d->segs) d->segs->prev = g;
  d->segs = g;
  grow_locked(d, nbytes);
  pthread_mutex_unlock(&d->lock);
  return c;
}

static void *cache_take(DeviceImpl *d, size_t nbytes) {
  void *p = NULL;
  pthread_mutex_lock(&d->lock);
  struct FreeBlock *b = bucket_find(d, nbytes);
  if (b && b->n) {
    b->used = ++d->clock;
    p = b->ptrs[--b->n];
    d->pub.cached_bytes -= nbytes;
    d->small_cached -= nbytes;
    d->live_bytes += nbytes;
    if (d->live_bytes > d->peak_live) d->peak_live = d->live_bytes;
  }
  pthread_mutex_unlock(&d->lock);
  return p;
}

/* A small block a buffer held goes back to the cache. */
static void cache_put(DeviceImpl *d, void *ptr, size_t nbytes) {
  pthread_mutex_lock(&d->lock);
  d->live_bytes -= nbytes;
  if (d->kind->host_memory && d->small_cached + nbytes > CACHE_CAP) small_cache_evict_locked(d, CACHE_CAP / 2);
  struct FreeBlock *b = bucket_find(d, nbytes);
  if (!b) b = bucket_insert(d, nbytes);
  b->used = ++d->clock;
  if (b->n == b->cap) {
    b->cap = b->cap ? b->cap * 2 : 4;
    b->ptrs = tg_xrealloc(b->ptrs, b->cap * sizeof *b->ptrs);
  }
  b->ptrs[b->n++] = ptr;
  d->pub.cached_bytes += nbytes;
  d->small_cached += nbytes;
  pthread_mutex_unlock(&d->lock);
}

/* Size of the block backing a buffer of nbytes; 0 on overflow. Zero-byte buffers get a real block
 * so that every buffer has a distinct, valid pointer. Large blocks are whole pages. */
static size_t block_size(size_t nbytes) {
  if (nbytes > SIZE_MAX - CHUNK_ALIGN) return 0;
  size_t sz = (nbytes + BLOCK_ALIGN - 1) & ~(BLOCK_ALIGN - 1);
  if (sz >= LARGE_MIN) sz = (sz + CHUNK_ALIGN - 1) & ~(CHUNK_ALIGN - 1);
  return sz ? sz : BLOCK_ALIGN;
}

static Buffer *buffer_struct(Device *dev, void *ptr, size_t nbytes, bool external) {
  Buffer *b = tg_xmalloc(sizeof *b);
  b->dev = dev;
  b->nbytes = nbytes;
  b->ptr = ptr;
  b->refcount = 1;
  b->external = external;
  b->chunk = NULL;
  b->on_free = NULL;
  b->on_free_ctx = NULL;
  b->img_w = b->img_h = 0;
  b->version = 0;
  atomic_fetch_add_explicit(&g_live_buffers, 1, memory_order_relaxed);
  return b;
}

/* The device's memory for sz bytes (a small block or a large chunk), taking idle memory first;
 * counted as live where it is taken. */
static void *block_new(DeviceImpl *d, size_t sz, Chunk **chunk) {
  Device *dev = &d->pub;
  void *ptr = NULL;
  *chunk = NULL;
  bool large = sz >= LARGE_MIN && d->kind->host_memory;
  if (large) {
    pthread_mutex_lock(&d->lock);
    Chunk *c = chunk_take_locked(d, sz);
    if (!c && d->live_bytes + dev->cached_bytes + sz > d->high_water)
      segments_release_locked(d, d->live_bytes + dev->cached_bytes + sz - d->high_water);
    pthread_mutex_unlock(&d->lock);
    if (c) {
      *chunk = c;
      return c->ptr;
    }
  } else if ((ptr = cache_take(d, sz))) {
    return ptr;
  } else if (!d->kind->host_memory) {
    /* a device of CPU cores: its memory is the host's, taken lazily (PoCL maps a buffer at its first
     * use and aborts when it cannot), so the address-space limit and the host's free memory bound it */
    size_t as = dev->caps.cpu_cores ? host_address_limit() : SIZE_MAX;
    pthread_mutex_lock(&d->lock);
    size_t peak = d->live_bytes + sz > d->peak_live ? d->live_bytes + sz : d->peak_live, limit = 2 * peak;
    if (d->small_cached && dev->caps.cpu_cores) {
      /* idle blocks never hold more than half the address-space limit, and go back when the host
       * has less free memory than the request */
      if (as != SIZE_MAX && as / 2 < limit) limit = as / 2;
      if (sz > host_free_memory()) limit = 0;
    }
    if (d->small_cached && d->live_bytes + dev->cached_bytes + sz > limit)
      small_cache_evict_locked(d, limit > d->live_bytes + sz ? limit - d->live_bytes - sz : 0);
    /* a request the address-space limit cannot take is an error here (PoCL would take the buffer
     * and abort the process at its first use) */
    size_t vm = as != SIZE_MAX ? process_vm_bytes() : 0;
    if (as != SIZE_MAX && vm + sz > as && d->small_cached) {
      small_cache_drop_locked(d);
      vm = process_vm_bytes();
    }
    pthread_mutex_unlock(&d->lock);
    if (as != SIZE_MAX && vm + sz > as) {
      tg_set_error(TG_ERR_RUNTIME, "%s: cannot allocate %zu bytes: the process's address-space limit (ulimit -v, %zu bytes) "
                   "has %zu bytes left", dev->name, sz, as, vm < as ? as - vm : 0);
      return NULL;
    }
  }
  for (int attempt = 0; attempt < 2; attempt++) {
    bool had_error = tg_has_error();
    if (large) {
      Chunk *c = segment_new(d, sz);
      if (c) *chunk = c, ptr = c->ptr;
    } else if ((ptr = dev->vt->alloc(dev->state, sz))) {
      pthread_mutex_lock(&d->lock);
      grow_locked(d, sz);
      pthread_mutex_unlock(&d->lock);
    }
    if (ptr || attempt) break;
    /* Idle cached memory may be what is missing: return it and try once more. */
    pthread_mutex_lock(&d->lock);
    bool had_cache = dev->cached_bytes > 0;
    if (had_cache) cache_drop_locked(d);
    pthread_mutex_unlock(&d->lock);
    if (!had_cache) break;
    if (!had_error) tg_clear_error();
  }
  return ptr;
}

Buffer *buffer_new(Device *dev, size_t nbytes) {
  if (!dev) {
    tg_set_error(TG_ERR_INVALID, "buffer_new: no device");
    return NULL;
  }
  if (!dev->vt) {
    tg_set_error(TG_ERR_INVALID, "buffer_new: %s is a device tuple; its tensors live in one buffer per member", dev->name);
    return NULL;
  }
  DeviceImpl *d = (DeviceImpl *)dev;
  size_t sz = block_size(nbytes);
  if (!sz) {
    tg_set_error(TG_ERR_RUNTIME, "buffer_new: cannot allocate %zu bytes on %s (size overflows)", nbytes,
                 dev->name);
    return NULL;
  }
  Chunk *chunk;
  void *ptr = block_new(d, sz, &chunk);
  if (!ptr) {
    tg_set_error(TG_ERR_RUNTIME, "buffer_new: cannot allocate %zu bytes on %s", nbytes, dev->name);
    return NULL;
  }
  atomic_fetch_add_explicit(&g_mem_used, sz, memory_order_relaxed);
  if (buffer_mem_hook) buffer_mem_hook(dev, (int64_t)sz);
  Buffer *b = buffer_struct(dev, ptr, nbytes, false);
  b->chunk = chunk;
  return b;
}

Buffer *buffer_new_image(Device *dev, int64_t w, int64_t h) {
  if (!dev) {
    tg_set_error(TG_ERR_INVALID, "buffer_new_image: no device");
    return NULL;
  }
  if (!dev->vt->alloc_image || !dev->caps.images) {
    tg_set_error(TG_ERR_INVALID, "buffer_new_image: %s has no 2-D images; unset IMAGE", dev->name);
    return NULL;
  }
  if (w < 1 || h < 1 || w > dev->caps.image_max_w || h > dev->caps.image_max_h) {
    tg_set_error(TG_ERR_INVALID, "buffer_new_image: a %lld x %lld image exceeds %s's limits (%lld x %lld texels)",
                 (long long)w, (long long)h, dev->name, (long long)dev->caps.image_max_w,
                 (long long)dev->caps.image_max_h);
    return NULL;
  }
  void *ptr = dev->vt->alloc_image(dev->state, w, h);
  if (!ptr) return NULL;
  size_t nbytes = (size_t)w * (size_t)h * 16;
  atomic_fetch_add_explicit(&g_mem_used, block_size(nbytes), memory_order_relaxed);
  if (buffer_mem_hook) buffer_mem_hook(dev, (int64_t)block_size(nbytes));
  Buffer *b = buffer_struct(dev, ptr, nbytes, false);
  b->img_w = w, b->img_h = h;
  return b;
}

Buffer *buffer_new_like(Device *dev, size_t nbytes, int64_t img_w, int64_t img_h) {
  return img_w ? buffer_new_image(dev, img_w, img_h) : buffer_new(dev, nbytes);
}

Buffer *buffer_wrap(Device *dev, void *ptr, size_t nbytes) {
  if (!dev || (!ptr && nbytes)) {
    tg_set_error(TG_ERR_INVALID, "buffer_wrap: %s", dev ? "NULL pointer" : "no device");
    return NULL;
  }
  return buffer_struct(dev, ptr, nbytes, true);
}

void buffer_on_free(Buffer *b, void (*fn)(void *ctx), void *ctx) {
  TG_ASSERT(b && b->external && !b->on_free);
  b->on_free = fn;
  b->on_free_ctx = ctx;
}

Buffer *buffer_ref(Buffer *b) {
  if (b) __atomic_fetch_add(&b->refcount, 1, __ATOMIC_RELAXED);
  return b;
}

void buffer_unref(Buffer *b) {
  if (!b) return;
  int left = __atomic_sub_fetch(&b->refcount, 1, __ATOMIC_ACQ_REL);
  TG_ASSERT(left >= 0);
  if (left) return;
  if (!b->external) {
    DeviceImpl *d = (DeviceImpl *)b->dev;
    size_t sz = block_size(b->nbytes);
    atomic_fetch_sub_explicit(&g_mem_used, sz, memory_order_relaxed);
    if (buffer_mem_hook) buffer_mem_hook(b->dev, -(int64_t)sz);
    if (b->img_w) {
      b->dev->vt->free(b->dev->state, b->ptr, b->nbytes); /* images never enter the caches */
    } else if (b->chunk) {
      pthread_mutex_lock(&d->lock);
      d->live_bytes -= sz;
      chunk_put_locked(d, b->chunk);
      pthread_mutex_unlock(&d->lock);
    } else {
      cache_put(d, b->ptr, sz);
    }
  }
  void (*on_free)(void *) = b->on_free;
  void *ctx = b->on_free_ctx;
  free(b);
  atomic_fetch_sub_explicit(&g_live_buffers, 1, memory_order_relaxed);
  if (on_free) on_free(ctx);
}

uint64_t device_mem_used(void) { return atomic_load(&g_mem_used); }
size_t buffer_live_count(void) { return atomic_load(&g_live_buffers); }

tg_status buffer_copyin(Buffer *b, const void *src, size_t nbytes) {
  if (!b || (!src && nbytes))
    return tg_set_error(TG_ERR_INVALID, "buffer_copyin: %s", b ? "NULL source" : "no buffer");
  if (nbytes > b->nbytes)
    return tg_set_error(TG_ERR_INVALID, "buffer_copyin: %zu bytes into a buffer of %zu", nbytes, b->nbytes);
  if (!nbytes) return TG_OK;
  buffer_written(b);
  return b->dev->vt->copyin(b->dev->state, b->ptr, src, nbytes);
}

tg_status buffer_copyout(Buffer *b, void *dst, size_t nbytes) {
  if (!b || (!dst && nbytes))
    return tg_set_error(TG_ERR_INVALID, "buffer_copyout: %s", b ? "NULL destination" : "no buffer");
  if (nbytes > b->nbytes)
    return tg_set_error(TG_ERR_INVALID, "buffer_copyout: %zu bytes from a buffer of %zu", nbytes, b->nbytes);
  if (!nbytes) return TG_OK;
  return b->dev->vt->copyout(b->dev->state, dst, b->ptr, nbytes);
}

tg_status buffer_copy(Buffer *dst, Buffer *src, size_t nbytes) {
  if (!dst || !src) return tg_set_error(TG_ERR_INVALID, "buffer_copy: no buffer");
  if (nbytes > dst->nbytes || nbytes > src->nbytes)
    return tg_set_error(TG_ERR_INVALID, "buffer_copy: %zu bytes from %zu-byte %s to %zu-byte %s", nbytes,
                        src->nbytes, src->dev->name, dst->nbytes, dst->dev->name);
  if (!nbytes || (dst->ptr == src->ptr && dst->dev == src->dev)) return TG_OK;
  buffer_written(dst);
  /* A host-memory side is its own staging buffer. */
  if (kind_of(dst->dev)->host_memory)
    return src->dev->vt->copyout(src->dev->state, dst->ptr, src->ptr, nbytes);
  if (kind_of(src->dev)->host_memory)
    return dst->dev->vt->copyin(dst->dev->state, dst->ptr, src->ptr, nbytes);
  if (dst->dev == src->dev && dst->dev->vt->copy) return dst->dev->vt->copy(dst->dev->state, dst->ptr, src->ptr, nbytes);
  if (dst->dev != src->dev && dst->dev->vt == src->dev->vt && dst->dev->vt->copy_peer) {
    int done = dst->dev->vt->copy_peer(dst->dev->state, dst->ptr, src->dev->state, src->ptr, nbytes);
    if (done) return done > 0 ? TG_OK : tg_last_status() ? tg_last_status() : TG_ERR_RUNTIME;
  }
  void *tmp = malloc(nbytes);
  if (!tmp) return tg_set_error(TG_ERR_RUNTIME, "buffer_copy: no host memory for %zu bytes", nbytes);
  tg_status st = src->dev->vt->copyout(src->dev->state, tmp, src->ptr, nbytes);
  if (st == TG_OK) st = dst->dev->vt->copyin(dst->dev->state, dst->ptr, tmp, nbytes);
  free(tmp);
  return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* program cache                                                                                   */

/* Entries are reference counted (program_get's callers hold them: the kernel cache, TinyJit
 * captures, BEAM candidates). One with no holder stays loaded for the next program_get until the
 * number loaded passes the limit; then the least recently used unheld ones are unloaded. An entry
 * of another device that shares a loaded object (`owner`, host-memory devices of one kind) pins
 * its owner (nshare) and unloads nothing itself. */
typedef struct ProgEntry {
  Program pub;
  uint64_t hash; /* of fname and src: entries for every device of one source share a chain */
  char *src;
  size_t srclen;
  bool ready; /* false while one thread compiles it; others wait on g_prog_cond */
  int refs;
  int nshare;
  uint64_t last_use;
  struct ProgEntry *owner;
  struct ProgEntry *next;
  const char *cid; /* the compiler that built it (compiler_id: CC may name another one later) */
} ProgEntry;

const char *device_compiler_id(Device *dev) { return dev->vt->compiler_id ? dev->vt->compiler_id(dev->state) : NULL; }

static pthread_mutex_t g_prog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_prog_cond = PTHREAD_COND_INITIALIZER;
static ProgEntry **g_prog_tab;
static size_t g_prog_cap, g_prog_n, g_prog_loaded;
static uint64_t g_prog_tick;

static void prog_insert_locked(ProgEntry *e) {
  if ((g_prog_n + 1) * 4 > g_prog_cap * 3) {
    size_t ncap = g_prog_cap ? g_prog_cap * 2 : 256;
    ProgEntry **nt = tg_xcalloc(ncap, sizeof *nt);
    for (size_t i = 0; i < g_prog_cap; i++) {
      for (ProgEntry *x = g_prog_tab[i], *nx; x; x = nx) {
        nx = x->next;
        x->next = nt[x->hash & (ncap - 1)];
        nt[x->hash & (ncap - 1)] = x;
      }
    }
    free(g_prog_tab);
    g_prog_tab = nt;
    g_prog_cap = ncap;
  }
  ProgEntry **slot = &g_prog_tab[e->hash & (g_prog_cap - 1)];
  e->next = *slot;
  *slot = e;
  g_prog_n++;
}

static void prog_remove_locked(ProgEntry *e) {
  for (ProgEntry **pp = &g_prog_tab[e->hash & (g_prog_cap - 1)]; *pp; pp = &(*pp)->next) {
    if (*pp == e) {
      *pp = e->next;
      g_prog_n--;
      return;
    }
  }
}

static ProgEntry *prog_new(Device *dev, const char *fname, const char *src, size_t srclen, uint64_t h) {
  ProgEntry *e = tg_xcalloc(1, sizeof *e);
  e->pub.dev = dev;
  e->pub.name = tg_xstrdup(fname);
  e->hash = h;
  e->src = tg_xmalloc(srclen + 1);
  memcpy(e->src, src, srclen + 1);
  e->srclen = srclen;
  e->cid = device_compiler_id(dev);
  return e;
}

static void prog_free(ProgEntry *e) {
  free(e->pub.name);
  free(e->src);
  free(e);
}

static size_t max_loaded(void) {
  return (size_t)getenv_int_in("MAX_LOADED_KERNELS", 4096, 1, INT64_MAX);
}

/* Caller holds g_prog_lock. Takes unheld entries out of the table, least recently used first, until
 * at most the limit are loaded; returns them as a list (through ->next) to unload outside the lock. */
static ProgEntry *prog_evict_locked(void) {
  ProgEntry *dead = NULL;
  size_t limit = max_loaded();
  while (g_prog_loaded > limit) {
    ProgEntry *victim = NULL;
    for (size_t i = 0; i < g_prog_cap; i++)
      for (ProgEntry *e = g_prog_tab[i]; e; e = e->next)
        if (e->ready && e->refs == 0 && e->nshare == 0 && !e->owner && (!victim || e->last_use < victim->last_use))
          victim = e;
    if (!victim) break; /* every loaded program is in use */
    prog_remove_locked(victim);
    g_prog_loaded--;
    victim->next = dead;
    dead = victim;
  }
  return dead;
}

void program_release(Program *p);

static void prog_unload_list(ProgEntry *dead) { /* (stand-ins are released with program_release) */
  while (dead) {
    ProgEntry *nx = dead->next;
    if (debug_level() >= 3) fprintf(stderr, "program cache: unloaded %s (least recently used)\n", dead->pub.name);
    if (dead->pub.handle) dead->pub.dev->vt->unload(dead->pub.dev->state, dead->pub.handle);
    program_release(dead->pub.stand_in);
    prog_free(dead);
    dead = nx;
  }
}

static ProgEntry *entry_of(Program *p) { return (ProgEntry *)((char *)p - offsetof(ProgEntry, pub)); }

Program *program_retain(Program *p) {
  if (!p) return NULL;
  pthread_mutex_lock(&g_prog_lock);
  entry_of(p)->refs++;
  pthread_mutex_unlock(&g_prog_lock);
  return p;
}

void program_release(Program *p) {
  if (!p) return;
  pthread_mutex_lock(&g_prog_lock);
  ProgEntry *e = entry_of(p), *dead = NULL;
  TG_ASSERT(e->refs > 0);
  e->refs--;
  /* a sibling nobody holds goes at once (it loaded nothing), freeing its owner for eviction */
  if (e->refs == 0 && e->owner) {
    prog_remove_locked(e);
    e->owner->nshare--;
  } else {
    e = NULL;
  }
  dead = prog_evict_locked();
  pthread_mutex_unlock(&g_prog_lock);
  if (e) prog_free(e);
  prog_unload_list(dead);
}

size_t program_loaded_count(void) {
  pthread_mutex_lock(&g_prog_lock);
  size_t n = g_prog_loaded;
  pthread_mutex_unlock(&g_prog_lock);
  return n;
}

/* Compiles src (through the device's disk cache) and loads fname from it. A binary that fails to
 * load (not a shared object, symbol missing) may have come from a damaged cache entry: the entry is
 * dropped and src compiled once more, so a bad entry costs one compile, not every run. */
static void *compile_and_load(Device *dev, const char *fname, const char *src) {
  void *handle = NULL;
  bool had_error = tg_has_error(); /* an earlier error of the caller's is not ours to clear */
  for (int attempt = 0; attempt < 2 && !handle; attempt++) {
    uint8_t *lib = NULL;
    size_t liblen = 0;
    if (dev->vt->compile(dev->state, src, &lib, &liblen) != TG_OK) break;
    atomic_fetch_add_explicit(&g_counters.compile_count, 1, memory_order_relaxed);
    handle = dev->vt->load(dev->state, fname, lib, liblen);
    free(lib);
    if (handle || !dev->vt->cache_evict) break;
    dev->vt->cache_evict(dev->state, src);
    if (attempt == 0 && !had_error) tg_clear_error(); /* the second attempt's error is the one to report */
  }
  return handle;
}

Program *program_get(Device *dev, const char *fname, const char *src) {
  if (!dev || !fname || !src) {
    tg_set_error(TG_ERR_INVALID, "program_get: %s", !dev ? "no device" : !fname ? "no name" : "no source");
    return NULL;
  }
  size_t srclen = strlen(src);
  uint64_t h = hash_bytes(src, srclen, hash_bytes(fname, strlen(fname), 0x7467707267ULL));
  bool shareable = kind_of(dev)->host_memory;
  const char *cid = device_compiler_id(dev);

  pthread_mutex_lock(&g_prog_lock);
  for (;;) {
    ProgEntry *mine = NULL, *sibling = NULL;
    bool busy = false;
    if (g_prog_cap) {
      for (ProgEntry *e = g_prog_tab[h & (g_prog_cap - 1)]; e; e = e->next) {
        if (e->hash != h || e->srclen != srclen || e->cid != cid || strcmp(e->pub.name, fname) != 0 ||
            memcmp(e->src, src, srclen) != 0)
          continue;
        if (e->pub.dev == dev) {
          mine = e;
          break;
        }
        if (shareable && e->pub.dev->vt == dev->vt && strcmp(e->pub.dev->arch, dev->arch) == 0 &&
            (!e->ready || e->pub.handle)) { /* (a tiered entry has no binary to share yet) */
          if (e->ready)
            sibling = e;
          else
            busy = true;
        }
      }
    }
    if (mine && mine->ready) {
      mine->refs++;
      mine->last_use = ++g_prog_tick;
      pthread_mutex_unlock(&g_prog_lock);
      return &mine->pub;
    }
    if (mine || (busy && !sibling)) {
      /* Someone is compiling this source: wait rather than compile it twice. */
      pthread_cond_wait(&g_prog_cond, &g_prog_lock);
      continue;
    }
    ProgEntry *e = prog_new(dev, fname, src, srclen, h);
    if (sibling) {
      /* Same code in the same address space: share the loaded program (it stays loaded while
       * this entry exists) */
      ProgEntry *owner = sibling->owner ? sibling->owner : sibling;
      e->pub.handle = owner->pub.handle;
      e->owner = owner;
      owner->nshare++;
      owner->last_use = ++g_prog_tick;
      e->ready = true;
      e->refs = 1;
      prog_insert_locked(e);
      pthread_mutex_unlock(&g_prog_lock);
      return &e->pub;
    }
    prog_insert_locked(e);
    pthread_mutex_unlock(&g_prog_lock);

    void *handle = compile_and_load(dev, fname, src);

    pthread_mutex_lock(&g_prog_lock);
    ProgEntry *dead = NULL;
    if (handle) {
      e->pub.handle = handle;
      e->ready = true;
      e->refs = 1;
      e->last_use = ++g_prog_tick;
      g_prog_loaded++;
      dead = prog_evict_locked();
    } else {
      prog_remove_locked(e);
      prog_free(e);
      e = NULL;
    }
    pthread_cond_broadcast(&g_prog_cond);
    pthread_mutex_unlock(&g_prog_lock);
    prog_unload_list(dead);
    return e ? &e->pub : NULL;
  }
}

char *program_disasm(Program *p) {
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "program_disasm: no program");
    return NULL;
  }
  if (!p->handle && p->stand_in) return program_disasm(p->stand_in); /* what runs until the binary is loaded */
  Device *dev = p->dev;
  if (!dev->vt->disasm) {
    tg_set_error(TG_ERR_INVALID, "program_disasm: device %s (renderer %s) cannot show its code", dev->name, dev->renderer);
    return NULL;
  }
  /* the binary again: from the disk cache, or compiled once more where there is none */
  ProgEntry *e = entry_of(p);
  uint8_t *lib = NULL;
  size_t liblen = 0;
  if (dev->vt->compile(dev->state, e->src, &lib, &liblen) != TG_OK) return NULL;
  char *s = dev->vt->disasm(dev->state, e->src, lib, liblen);
  free(lib);
  return s;
}

double program_exec(Program *p, void **bufs, int nbufs, int nvals, const int64_t *global_size, const int64_t *local_size,
                    bool wait) {
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "program_exec: no program");
    return -1.0;
  }
  void *h = atomic_load_explicit(&p->handle, memory_order_acquire);
  if (!h && p->stand_in) return program_exec(p->stand_in, bufs, nbufs, nvals, global_size, local_size, wait);
  return p->dev->vt->exec(p->dev->state, h, bufs, nbufs, nvals, global_size, local_size, wait);
}

static uint64_t prog_hash(const char *fname, const char *src, size_t srclen) {
  return hash_bytes(src, srclen, hash_bytes(fname, strlen(fname), 0x7467707267ULL));
}

/* The kernels of a batch with no program of dev yet (their indices into todo); *have counts the
 * others. */
static int batch_todo(Device *dev, const char *const *fnames, const char *const *srcs, int n, int *todo, int *have) {
  int ntodo = 0;
  const char *cid = device_compiler_id(dev);
  pthread_mutex_lock(&g_prog_lock);
  for (int i = 0; i < n; i++) {
    size_t srclen = strlen(srcs[i]);
    uint64_t h = prog_hash(fnames[i], srcs[i], srclen);
    bool found = false;
    for (ProgEntry *e = g_prog_cap ? g_prog_tab[h & (g_prog_cap - 1)] : NULL; e && !found; e = e->next)
      found = e->hash == h && e->srclen == srclen && e->pub.dev == dev && e->cid == cid && strcmp(e->pub.name, fnames[i]) == 0 &&
              memcmp(e->src, srcs[i], srclen) == 0;
    if (found) (*have)++;
    else todo[ntodo++] = i;
  }
  pthread_mutex_unlock(&g_prog_lock);
  return ntodo;
}

/* One translation unit of the todo kernels; the t-th one's entry point is renamed <fname>__b<t>
 * (tiered: a batch of one is its source as it is, the unit program_get compiles). */
static void batch_source(SB *all, const char *const *fnames, const char *const *srcs, const int *todo, int ntodo) {
  sb_init(all);
  if (ntodo == 1 && fnames == NULL) {
    sb_puts(all, srcs[todo[0]]);
    return;
  }
  for (int t = 0; t < ntodo; t++) {
    int i = todo[t];
    sb_printf(all, "#define %s %s__b%d\n%s#undef %s\n", fnames[i], fnames[i], t, srcs[i], fnames[i]);
  }
}

bool program_batch_cached(Device *dev, const char *const *fnames, const char *const *srcs, int n) {
  if (!dev || n <= 0 || !dev->vt->cached) return true;
  int *todo = tg_xmalloc(sizeof(int) * (size_t)n);
  int have = 0, ntodo = batch_todo(dev, fnames, srcs, n, todo, &have);
  bool cached = true;
  if (ntodo >= 1) {
    SB all;
    batch_source(&all, ntodo == 1 ? NULL : fnames, srcs, todo, ntodo);
    cached = dev->vt->cached(dev->state, all.s);
    sb_free(&all);
  }
  free(todo);
  return cached;
}

/* ---- tiered programs: entries that run a stand-in until the background compile of their batch
 * loads their own binary. The job holds one reference to each entry, so none is unloaded before. */
static size_t g_prog_pending;

typedef struct {
  Device *dev;
  int n;
  ProgEntry **e;
  double t0;
} TierJob;

static void tier_done(void *ctx, const uint8_t *lib, size_t liblen, const char *err) {
  TierJob *j = ctx;
  int loaded = 0;
  for (int t = 0; t < j->n && lib; t++) {
    char sym[160];
    if (j->n == 1) snprintf(sym, sizeof sym, "%s", j->e[t]->pub.name);
    else snprintf(sym, sizeof sym, "%s__b%d", j->e[t]->pub.name, t);
    void *h = j->dev->vt->load(j->dev->state, sym, lib, liblen);
    if (!h) {
      if (debug_level() >= 1) fprintf(stderr, "tiered compile: %s did not load: %s\n", j->e[t]->pub.name, tg_last_error());
      tg_clear_error();
      continue;
    }
    atomic_store_explicit(&j->e[t]->pub.handle, h, memory_order_release);
    loaded++;
  }
  if (!lib && err) {
    /* the stand-ins keep running; say so once, since the device's compiler is broken */
    static _Atomic int said;
    if (!atomic_exchange(&said, 1) || debug_level() >= 2)
      fprintf(stderr, "tinygrad.c: the background compile of %d %s kernels failed; they keep running their %s code:\n%s\n",
                j->n, j->dev->name, j->e[0]->pub.stand_in->dev->name, err ? err : "?");
  }
  if (debug_level() >= 3 && (lib || err))
    fprintf(stderr, "tiered compile: %d of %d %s kernels replaced their stand-ins after %.1f ms\n", loaded, j->n, j->dev->name,
            (now_seconds() - j->t0) * 1e3);
  pthread_mutex_lock(&g_prog_lock);
  g_prog_pending -= (size_t)j->n;
  pthread_cond_broadcast(&g_prog_cond);
  pthread_mutex_unlock(&g_prog_lock);
  for (int t = 0; t < j->n; t++) program_release(&j->e[t]->pub);
  free(j->e);
  free(j);
}

int program_get_batch_tiered(Device *dev, const char *const *fnames, const char *const *srcs, Program *const *stand_ins,
                             int n) {
  if (!dev || n <= 0 || !dev->vt->compile_async) return 0;
  int *todo = tg_xmalloc(sizeof(int) * (size_t)n);
  int have = 0, ntodo = batch_todo(dev, fnames, srcs, n, todo, &have);
  if (ntodo < 1 || !program_tier_room(ntodo)) {
    free(todo);
    return ntodo < 1 ? have : 0;
  }
  TierJob *j = tg_xcalloc(1, sizeof *j);
  j->dev = dev;
  j->n = ntodo;
  j->e = tg_xcalloc((size_t)ntodo, sizeof *j->e);
  j->t0 = now_seconds();
  for (int t = 0; t < ntodo; t++) {
    int i = todo[t];
    size_t srclen = strlen(srcs[i]);
    ProgEntry *e = prog_new(dev, fnames[i], srcs[i], srclen, prog_hash(fnames[i], srcs[i], srclen));
    e->pub.stand_in = program_retain(stand_ins[i]);
    e->ready = true;
    e->refs = 1; /* the job's */
    j->e[t] = e;
  }
  SB all;
  batch_source(&all, ntodo == 1 ? NULL : fnames, srcs, todo, ntodo);
  /* in the table before the job is queued: its completion may come at once */
  pthread_mutex_lock(&g_prog_lock);
  ProgEntry *dead = NULL;
  for (int t = 0; t < ntodo; t++) {
    j->e[t]->last_use = ++g_prog_tick;
    prog_insert_locked(j->e[t]);
    g_prog_loaded++;
  }
  g_prog_pending += (size_t)ntodo;
  pthread_cond_broadcast(&g_prog_cond);
  pthread_mutex_unlock(&g_prog_lock);
  if (!dev->vt->compile_async(dev->state, all.s, tier_done, j)) {
    /* nothing queued: take the entries out again (one a program_get found meanwhile stays, and
     * runs its stand-in) */
    tg_clear_error();
    pthread_mutex_lock(&g_prog_lock);
    g_prog_pending -= (size_t)ntodo;
    for (int t = 0; t < ntodo; t++) {
      ProgEntry *e = j->e[t];
      if (--e->refs == 0) {
        prog_remove_locked(e);
        g_prog_loaded--;
        e->next = dead;
        dead = e;
      }
    }
    pthread_cond_broadcast(&g_prog_cond);
    pthread_mutex_unlock(&g_prog_lock);
    prog_unload_list(dead);
    free(j->e);
    free(j);
    ntodo = 0;
  }
  sb_free(&all);
  free(todo);
  return have + ntodo;
}

/* Tiered programs hold their stand-ins loaded, and cannot be unloaded before their binary comes: at
 * most a quarter of MAX_LOADED_KERNELS of them wait at a time (past that, kernels compile as usual). */
bool program_tier_room(int n) {
  size_t cap = max_loaded() / 4;
  pthread_mutex_lock(&g_prog_lock);
  bool room = g_prog_pending + (size_t)n <= (cap ? cap : 1);
  pthread_mutex_unlock(&g_prog_lock);
  return room;
}

size_t program_tier_pending(void) {
  pthread_mutex_lock(&g_prog_lock);
  size_t n = g_prog_pending;
  pthread_mutex_unlock(&g_prog_lock);
  return n;
}

void program_tier_wait(void) {
  pthread_mutex_lock(&g_prog_lock);
  while (g_prog_pending) pthread_cond_wait(&g_prog_cond, &g_prog_lock);
  pthread_mutex_unlock(&g_prog_lock);
}

/* Compiles several kernels in one compiler run (one translation unit, one shared object): process
 * start-up and the compiler's fixed costs are paid once. Kernels already loaded are skipped. Each
 * kernel's entry point is renamed (#define) so equal names from different sources cannot clash.
 * Returns the number of programs now available; programs that fail here are left for program_get,
 * which reports their own error. Never records an error itself. */
int program_get_batch(Device *dev, const char *const *fnames, const char *const *srcs, int n) {
  if (!dev || n <= 0) return 0;
  if (dev->vt->no_batch) {
    /* one compile each (the caller runs batches on several threads); they stay loaded, unheld */
    int have = 0;
    bool had = tg_has_error();
    for (int i = 0; i < n; i++) {
      Program *p = program_get(dev, fnames[i], srcs[i]);
      if (p) have++, program_release(p);
      else if (!had) tg_clear_error();
    }
    return have;
  }
  int *todo = tg_xmalloc(sizeof(int) * (size_t)n);
  int have = 0, ntodo = batch_todo(dev, fnames, srcs, n, todo, &have);
  if (ntodo < 2) {
    free(todo);
    return have;
  }
  SB all;
  batch_source(&all, fnames, srcs, todo, ntodo);
  uint8_t *lib = NULL;
  size_t liblen = 0;
  tg_status st = dev->vt->compile(dev->state, all.s, &lib, &liblen);
  if (st != TG_OK) {
    tg_clear_error();
    sb_free(&all);
    free(todo);
    return have;
  }
  /* compile_count counts kernels, so a batch of n counts n */
  atomic_fetch_add_explicit(&g_counters.compile_count, (uint64_t)ntodo, memory_order_relaxed);
  bool damaged = false;
  for (int t = 0; t < ntodo; t++) {
    int i = todo[t];
    char sym[160];
    snprintf(sym, sizeof sym, "%s__b%d", fnames[i], t);
    void *handle = dev->vt->load(dev->state, sym, lib, liblen);
    if (!handle) {
      tg_clear_error();
      damaged = true;
      continue;
    }
    size_t srclen = strlen(srcs[i]);
    uint64_t h = hash_bytes(srcs[i], srclen, hash_bytes(fnames[i], strlen(fnames[i]), 0x7467707267ULL));
    ProgEntry *e = prog_new(dev, fnames[i], srcs[i], srclen, h);
    e->pub.handle = handle;
    e->ready = true;
    pthread_mutex_lock(&g_prog_lock);
    e->last_use = ++g_prog_tick;
    prog_insert_locked(e);
    g_prog_loaded++;
    ProgEntry *dead = prog_evict_locked();
    pthread_cond_broadcast(&g_prog_cond);
    pthread_mutex_unlock(&g_prog_lock);
    prog_unload_list(dead);
    have++;
  }
  /* a symbol missing from the batch's binary: its cache entry is not what this batch compiled
   * (program_get then compiles those kernels one by one) */
  if (damaged && dev->vt->cache_evict) dev->vt->cache_evict(dev->state, all.s);
  sb_free(&all);
  free(lib);
  free(todo);
  return have;
}
