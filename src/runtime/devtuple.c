/*
 * devtuple.c -- device tuples: the device of a tensor spread over several devices ("CPU,CPU:1").
 *
 * A tuple is a pseudo-device in the device id space (ids from DEVICE_TUPLE_BASE up), so a
 * multi-device tensor node carries one int device like any other node and every name lookup
 * (device_by_id(id)->name, device_get(name)) works on it. A tuple has no vtable: it holds no
 * buffers and runs no kernels (buffer_new refuses it); its members do. Tuples are interned by
 * their member list and live for the process, as open devices do. There is no tuple of one
 * device: it is the device (tinygrad's shard over one device is `to` that device), so a tensor
 * never reports a device name ("CPU") that other tensors on "CPU" do not share.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

typedef struct Tuple {
  Device d; /* first: a Tuple is a Device */
  int n;
  int *ids;
  char *full; /* the whole name (d.name holds as many members as fit) */
} Tuple;

static Tuple **g_tuples;
static int g_ntuples, g_cap;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

Device *device_tuple_of(const int *ids, int n) {
  if (n < 1) {
    tg_set_error(TG_ERR_INVALID, "device tuple: no devices given");
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    Device *m = device_by_id(ids[i]);
    if (!m || !m->vt) {
      tg_set_error(TG_ERR_INVALID, "device tuple: member %d is not a single device", i);
      return NULL;
    }
    for (int j = 0; j < i; j++)
      if (ids[j] == ids[i]) {
        tg_set_error(TG_ERR_INVALID, "device tuple: %s is listed twice (each device holds one shard)", m->name);
        return NULL;
      }
  }
  if (n == 1) return device_by_id(ids[0]);
  pthread_mutex_lock(&g_lock);
  Tuple *t = NULL;
  for (int i = 0; i < g_ntuples && !t; i++)
    if (g_tuples[i]->n == n && !memcmp(g_tuples[i]->ids, ids, sizeof(int) * (size_t)n)) t = g_tuples[i];
  if (!t) {
    t = tg_xmalloc(sizeof *t);
    memset(t, 0, sizeof *t);
    t->n = n;
    t->ids = tg_xmalloc(sizeof(int) * (size_t)n);
    memcpy(t->ids, ids, sizeof(int) * (size_t)n);
    size_t o = 0, total = 1;
    for (int i = 0; i < n; i++) total += strlen(device_by_id(ids[i])->name) + 1;
    t->full = tg_xmalloc(total);
    for (int i = 0; i < n; i++) {
      const char *nm = device_by_id(ids[i])->name;
      size_t l = strlen(nm);
      if (i) t->full[o++] = ',';
      memcpy(t->full + o, nm, l);
      o += l;
    }
    t->full[o] = 0;
    /* d.name: the members that fit, then ",..." (messages); tg_device_of gives the whole name */
    snprintf(t->d.name, sizeof t->d.name, "%s", t->full);
    if (o >= sizeof t->d.name) {
      char *cut = strrchr(t->d.name, ',');
      while (cut && (size_t)(cut - t->d.name) + 5 > sizeof t->d.name) {
        *cut = 0;
        cut = strrchr(t->d.name, ',');
      }
      if (cut) strcpy(cut, ",...");
    }
    t->d.renderer = device_by_id(ids[0])->renderer;
    t->d.caps = device_by_id(ids[0])->caps;
    t->d.index = -1;
    if (g_ntuples == g_cap) g_tuples = tg_xrealloc(g_tuples, sizeof *g_tuples * (size_t)(g_cap = g_cap ? g_cap * 2 : 8));
    t->d.id = DEVICE_TUPLE_BASE + g_ntuples;
    __atomic_store_n(&g_tuples[g_ntuples], t, __ATOMIC_RELEASE);
    __atomic_store_n(&g_ntuples, g_ntuples + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_lock);
  return &t->d;
}

Device *device_tuple_by_id(int id) {
  int k = id - DEVICE_TUPLE_BASE;
  pthread_mutex_lock(&g_lock);
  Device *d = k >= 0 && k < g_ntuples ? &g_tuples[k]->d : NULL;
  pthread_mutex_unlock(&g_lock);
  return d;
}

const char *device_full_name(const Device *d) {
  Tuple *t = d && d->id >= DEVICE_TUPLE_BASE ? (Tuple *)device_tuple_by_id(d->id) : NULL;
  return t ? t->full : d ? d->name : NULL;
}

int device_tuple_members(int id, const int **ids) {
  Tuple *t = (Tuple *)device_tuple_by_id(id);
  if (!t) return 0;
  *ids = t->ids;
  return t->n;
}

Device *device_tuple_get(const char *names) {
  int cap = 1;
  for (const char *p = names; *p; p++) cap += *p == ',';
  int *ids = tg_xmalloc(sizeof(int) * (size_t)cap);
  int n = 0;
  const char *p = names;
  Device *r = NULL;
  for (;;) {
    const char *e = device_tuple_sep(p);
    size_t l = e ? (size_t)(e - p) : strlen(p);
    while (l && (*p == ' ' || *p == '(')) p++, l--;
    while (l && (p[l - 1] == ' ' || p[l - 1] == ')')) l--;
    if (l == 0 && !e && n > 0) break; /* a trailing comma: "CPU," is a tuple of one */
    char one[160];
    if (l == 0 || l >= sizeof one) {
      tg_set_error(TG_ERR_INVALID, "device_get: member %d of device tuple '%s' is %s (members are device names separated by "
                   "single commas, e.g. 'CPU:0,CPU:1')", n, names, l ? "too long" : "empty");
      goto out;
    }
    memcpy(one, p, l);
    one[l] = 0;
    Device *d = device_get(one);
    if (!d) goto out;
    ids[n++] = d->id;
    if (!e) break;
    p = e + 1;
  }
  r = device_tuple_of(ids, n);
out:
  free(ids);
  return r;
}
