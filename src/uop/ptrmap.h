/*
 * ptrmap.h -- a small open-addressing hash map from pointer (or 64-bit key) to pointer, used as
 * per-pass scratch (memo tables, visited sets). Keys are never 0. Grows by doubling; no fixed size.
 */
#ifndef TG_PTRMAP_H
#define TG_PTRMAP_H

#include <stdint.h>
#include <stdlib.h>

#include "../helpers.h"

typedef struct {
  uint64_t *keys;
  void **vals;
  size_t cap, len;
} PtrMap;

static inline uint64_t pm_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}
static inline void pm_init(PtrMap *m) { m->keys = NULL, m->vals = NULL, m->cap = m->len = 0; }
static inline void pm_free(PtrMap *m) {
  free(m->keys);
  free(m->vals);
  pm_init(m);
}
static inline void pm_clear(PtrMap *m) {
  for (size_t i = 0; i < m->cap; i++) m->keys[i] = 0;
  m->len = 0;
}
static inline void **pm_slot(PtrMap *m, uint64_t k) {
  size_t mask = m->cap - 1, i = pm_hash(k) & mask;
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  return &m->vals[i];
}
static inline void *pm_get(const PtrMap *m, uint64_t k) {
  if (!m->cap) return NULL;
  size_t mask = m->cap - 1, i = pm_hash(k) & mask;
  while (m->keys[i]) {
    if (m->keys[i] == k) return m->vals[i];
    i = (i + 1) & mask;
  }
  return NULL;
}
static inline int pm_has(const PtrMap *m, uint64_t k) {
  if (!m->cap) return 0;
  size_t mask = m->cap - 1, i = pm_hash(k) & mask;
  while (m->keys[i]) {
    if (m->keys[i] == k) return 1;
    i = (i + 1) & mask;
  }
  return 0;
}
static inline void pm_put(PtrMap *m, uint64_t k, void *v) {
  if ((m->len + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uint64_t *ok = m->keys;
    void **ov = m->vals;
    size_t ocap = m->cap;
    m->keys = (uint64_t *)tg_xcalloc(ncap, sizeof(uint64_t));
    m->vals = (void **)tg_xcalloc(ncap, sizeof(void *));
    m->cap = ncap;
    m->len = 0;
    for (size_t i = 0; i < ocap; i++)
      if (ok[i]) pm_put(m, ok[i], ov[i]);
    free(ok);
    free(ov);
  }
  size_t mask = m->cap - 1, i = pm_hash(k) & mask;
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  if (!m->keys[i]) m->keys[i] = k, m->len++;
  m->vals[i] = v;
}

/* Removes k (if present), shifting later entries of its probe run back so lookups stay correct. */
static inline void pm_del(PtrMap *m, uint64_t k) {
  if (!m->cap) return;
  size_t mask = m->cap - 1, i = pm_hash(k) & mask;
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
  if (!m->keys[i]) return;
  m->keys[i] = 0, m->vals[i] = NULL, m->len--;
  for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
    size_t h = pm_hash(m->keys[j]) & mask;
    /* the entry at j may stay if its home h lies cyclically in (i, j] */
    int stay = i <= j ? (i < h && h <= j) : (i < h || h <= j);
    if (stay) continue;
    m->keys[i] = m->keys[j], m->vals[i] = m->vals[j];
    m->keys[j] = 0, m->vals[j] = NULL;
    i = j;
  }
}

/* Growable array of pointers. */
typedef struct {
  void **p;
  size_t n, cap;
} PtrVec;
static inline void pv_push(PtrVec *v, void *x) {
  if (v->n == v->cap) {
    v->cap = v->cap ? v->cap * 2 : 16;
    v->p = (void **)tg_xrealloc(v->p, v->cap * sizeof(void *));
  }
  v->p[v->n++] = x;
}
static inline void pv_free(PtrVec *v) {
  free(v->p);
  v->p = NULL, v->n = v->cap = 0;
}

#endif
