/*
 * engine.h -- execution internals shared by realize.c and jit.c: a capture of executed kernels
 * (TinyJit) and replaying it with some buffers swapped.
 */
#ifndef TG_ENGINE_H
#define TG_ENGINE_H

#include "../codegen/codegen.h"
#include "../runtime/device.h"

/* One executed item: a kernel launch or a device copy, with references to the buffers it used. */
typedef struct {
  Program *prg;          /* NULL for a copy */
  const KernelCode *code;/* launch sizes, name, ops (owned by the kernel cache) */
  Buffer **bufs;         /* owned refs; bufs[0] is written */
  int nbufs;
  size_t nbytes;         /* copy size */
} CapItem;

typedef struct {
  CapItem *items;
  int n, cap;
} Capture;

/* While non-NULL (per thread), every executed item is appended to it. */
extern _Thread_local Capture *g_capture;
void capture_free(Capture *c);
/* Replays c with buffers from[i] replaced by to[i]. */
tg_status capture_replay(const Capture *c, Buffer *const *from, Buffer *const *to, int n);

#endif
