/*
 * schedule.h -- turning a lazy tensor graph into an ordered list of kernels (fusion) and the buffers
 * they read and write (memory planning).
 */
#ifndef TG_SCHEDULE_H
#define TG_SCHEDULE_H

#include "bufnode.h"

enum { SI_KERNEL, SI_COPY, SI_COLLECTIVE };

/* One buffer of a schedule: pre-existing (a realized input) or created by a kernel. */
typedef struct {
  Buffer *buf;    /* owned ref once allocated; NULL until the producing item runs */
  Device *dev;
  size_t nbytes;
  int last_use;   /* index of the last item that reads it */
  bool keep;      /* outlives the schedule (realize target, or pre-existing) */
  UOp *node;      /* tensor node this buffer holds (borrowed) */
  int64_t img_w, img_h; /* IMAGE: a 2-D image of float4 texels (0: a plain buffer) */
} SBuf;

typedef struct {
  int kind;
  UOp *ast;       /* SI_KERNEL: kernel AST (owned). Param i of the AST is bufs[i]; bufs[0] is the output.
                   * A param held in an image is DEFINE_GLOBAL with iarg {texels per row} */
  int *bufs;
  int nbufs;
  Device *dev;
  int64_t root;   /* SI_COLLECTIVE: the COLLECTIVE node's arg (bufs[0] = op(bufs[1])); with nbufs > 2,
                   * a member of an allreduce over this process's devices: bufs[0] = redop over
                   * bufs[1..nbufs) (one part per device), root = the member's index */
  int dtype;      /* SI_COLLECTIVE: the element type */
  int redop;      /* SI_COLLECTIVE with nbufs > 2: OP_ADD or OP_MAX */
} SItem;

typedef struct {
  SItem *items;
  int nitems, capitems;
  SBuf *bufs;
  int nbufs, capbufs;
  /* Every ASSIGN the schedule carries out (borrowed: reachable from the targets) and the sbuf it
   * writes. The engine marks them realized afterwards, targets or not, so an assign never runs twice. */
  UOp **assigns;
  int *assign_bufs;
  int nassigns;
  /* The variables the graph's symbolic sizes use (tg_sym codes) and their bound values: kernels
   * take them as arguments (vars[i] is a variable index, vals[i] its value). */
  int *vars;
  int64_t *vals;
  int nvars;
  bool region_hazard; /* (while building) an assign into a region reads its target elsewhere */
  /* a symbolic size is 0 or 1 now: the tensor layer may have built the graph treating it as a
   * plain size-1 dim (broadcasting), so its kernels need not hold for other values */
  bool sym_unit;
  bool sym_baked; /* a node has UOPF_SYM_BAKED: its kernels hold for the bound values only */
} Schedule;

/* Builds the schedule realizing `targets` (nodes already realized or plain buffer views produce no
 * items). On success each target that needs a buffer has tbuf[i] = index into s->bufs (else -1). */
tg_status schedule_build(Schedule *s, UOp **targets, int n, int *tbuf);
/* The depth bound of a kernel's expression (DEPTH_SPLIT, default 256, 8..512). */
int schedule_depth_bound(void);
void schedule_free(Schedule *s);

/* The schedule cache (schedcache.c). schedule_key writes out the structure of the graph of `targets`
 * (NULL: not a graph the cache takes, or SCACHE=0); schedule_from_cache fills s and tbuf as
 * schedule_build would when a schedule of that structure is cached; schedule_cache_put caches the
 * one schedule_build made for the key (before it runs: its buffers not yet allocated). The caller
 * holds the realize lock. */
typedef struct SchedKey SchedKey;
SchedKey *schedule_key(UOp **targets, int n);
bool schedule_from_cache(SchedKey *k, Schedule *s, int *tbuf);
void schedule_cache_put(SchedKey *k, const Schedule *s, const int *tbuf);
void schedule_key_free(SchedKey *k);
size_t schedule_cache_count(void);  /* schedules cached now */
uint64_t schedule_cache_hits(void); /* realizes that took a cached schedule, ever */

#endif
